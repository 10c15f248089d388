"""strict-gate: greedy token-equality gates between an inference engine and vLLM.

The library entry points (docs/python-api.md) are imported on first use, so
`import strict_gate` stays light: no engine, no torch, no vLLM until a gate runs one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "load_gate_config": "strict_gate.gate.config",
    "GateConfig": "strict_gate.gate.config",
    "run_gate": "strict_gate.gate.run",
    "compare_run_dirs": "strict_gate.offline.compare",
    "capture_baseline": "strict_gate.gate.stored",
    "GateOutcome": "strict_gate.gate.outcome",
    "rediagnose": "strict_gate.gate.rescore",
    "run_bench": "strict_gate.speed.bench",
    "BenchOutcome": "strict_gate.speed.bench",
    "SpeedResult": "strict_gate.speed.model",
    "GateResult": "strict_gate.judge.result",
    "StrictGateError": "strict_gate.errors",
    "InputError": "strict_gate.errors",
    "ConfigError": "strict_gate.errors",
    "MissingExtraError": "strict_gate.errors",
    "EngineError": "strict_gate.errors",
    "IncompleteRunError": "strict_gate.errors",
    "shipped": "strict_gate.core.shipped",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from strict_gate.core.shipped import shipped
    from strict_gate.errors import (
        ConfigError,
        EngineError,
        IncompleteRunError,
        InputError,
        MissingExtraError,
        StrictGateError,
    )
    from strict_gate.gate.config import GateConfig, load_gate_config
    from strict_gate.gate.outcome import GateOutcome
    from strict_gate.gate.rescore import rediagnose
    from strict_gate.gate.run import run_gate
    from strict_gate.gate.stored import capture_baseline
    from strict_gate.judge.result import GateResult
    from strict_gate.offline.compare import compare_run_dirs
    from strict_gate.speed.bench import BenchOutcome, run_bench
    from strict_gate.speed.model import SpeedResult

    __version__: str


def _version() -> str:
    """The installed distribution's version; a bare source tree (PYTHONPATH) has none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("strict-gate")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _version()
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'strict_gate' has no attribute {name!r}")
    globals()[name] = value  # resolved once; later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
