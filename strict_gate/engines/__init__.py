"""Engine registry: kind -> "module:Class", imported only when a gate asks for that kind."""

from __future__ import annotations

import importlib

from strict_gate.core.options import did_you_mean
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError
from strict_gate.runs.records import ScoredStep

ENGINES: dict[str, str] = {
    "hf": "strict_gate.engines.hf:HFEngine",
    "vllm": "strict_gate.engines.vllm.engine:VLLMEngine",
    "openai": "strict_gate.engines.openai.engine:OpenAIEngine",
    "command": "strict_gate.engines.command.engine:CommandEngine",
    "recorded": "strict_gate.engines.recorded:RecordedEngine",
}


def engine_class(kind: str) -> type[Engine]:
    """The engine class for `kind`; an unknown kind is answered with the known ones."""
    if kind not in ENGINES:
        raise ConfigError(
            f"unknown engine kind {kind!r}{did_you_mean(kind, ENGINES)} (known: {', '.join(sorted(ENGINES))})"
        )
    module, _, cls = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["ENGINES", "Engine", "PromptInput", "ScoredStep", "engine_class"]
