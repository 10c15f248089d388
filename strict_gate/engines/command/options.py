"""A command engine's options, the `[candidate]` table of `kind = "command"`: read by the engine
and by the process that runs its binary, so they live apart from both."""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.core.options import Argv, Checked, Seconds


@dataclass(frozen=True)
class CommandOptions(Checked):
    command: Argv
    tokenizer: str | None = None  # tokenizer.json or a model dir holding one (for text prompts)
    model: str | None = None  # informational: what the binary serves (the hello may say it too)
    dtype: str | None = None  # informational: what the binary computes in (a noise profile names it)
    timeout_s: Seconds = 120.0  # per request
    startup_timeout_s: Seconds = 300.0  # until the hello line
    cwd: str | None = None  # default: the config's directory
    log: str | None = None  # stderr log; default: the run directory's engine.log, else a temp file
    eos_token_ids: list[int] | None = None  # default: from generation_config.json / config.json by the tokenizer
