"""The `[speed]` table of a gate config: warm-up, repetitions, the ladder, the bar.

```toml
[speed]
warmup = 1                       # discarded repetitions
runs = 5                         # measured repetitions
rungs = ["128/128", "1024/128", "gate"]   # prompt tokens / generated tokens; "gate": the gate's prompt set
concurrency = [1, 4]             # sequences in flight, for engines that serve batches
min_speed_ratio = { decode = 0.95, ttft = 0.9 }   # or a bare number: the decode bar
seed = 0                         # of the synthesised ladder prompts
```

Like the rest of the config, an unknown key or a bad value is exit 2 naming the file and line.
A rung's prompt plus generated tokens may not exceed MAX_RUNG_TOKENS (2^20): the ladder drops a
rung over an engine's stated context, but where no engine states one, a rung such as
"99999999/1" would have the gate synthesise a prompt of 10^8 tokens before anything is timed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strict_gate.core.features import TableContext
from strict_gate.core.options import did_you_mean
from strict_gate.errors import ConfigError

SPEED_KEYS = {"warmup", "runs", "rungs", "concurrency", "min_speed_ratio", "seed"}
BAR_KEYS = ("decode", "ttft", "e2e")
DEFAULT_RUNGS = ("128/128", "1024/128", "4096/128", "gate")
GATE_RUNG = "gate"
_RUNG = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
MAX_RUNG_TOKENS = 2**20  # prompt + generated tokens of one rung (1,048,576): a million-token context


@dataclass(frozen=True)
class RungSpec:
    """A rung as written: `prompt_tokens/max_tokens`, or the gate's own prompt set (both None)."""

    name: str
    prompt_tokens: int | None = None
    max_tokens: int | None = None

    @property
    def is_gate(self) -> bool:
        return self.prompt_tokens is None


@dataclass(frozen=True)
class TokenRules:
    """How the speed arm checks the tokens it times, taken from the gate: both arms are asked
    for the gate's top-k (at least 1: every engine kind then answers with token ids), and the
    comparator judges the replies with the gate's band and greedy tolerance."""

    top_logprobs: int
    band: float
    greedy_tolerance: float
    eos_ids: frozenset[int] = frozenset()  # what the timed requests (ignore_eos) told the engines to go past


@dataclass(frozen=True)
class SpeedConfig:
    warmup: int = 1
    runs: int = 5
    rungs: tuple[RungSpec, ...] = ()
    concurrency: tuple[int, ...] = (1,)
    min_speed_ratio: dict[str, float] = field(default_factory=dict)
    seed: int = 0


def parse_rung(text: object) -> RungSpec:
    """"128/128" or "gate"; ValueError with the reason otherwise."""
    if text == GATE_RUNG:
        return RungSpec(GATE_RUNG)
    m = _RUNG.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f'rung {text!r} is not "PROMPT_TOKENS/MAX_TOKENS" (e.g. "128/128") or "gate"')
    if len(m.group(1)) + len(m.group(2)) > 16:  # no 4300-digit int() either
        raise ValueError(f"rung {str(text)[:24]!r}...: a rung has at most {MAX_RUNG_TOKENS} prompt + generated tokens")
    p, t = int(m.group(1)), int(m.group(2))
    if p < 1 or t < 1:
        raise ValueError(f"rung {text!r}: prompt and generated tokens must both be >= 1")
    if p + t > MAX_RUNG_TOKENS:
        raise ValueError(f"rung {text!r}: {p + t} prompt + generated tokens; a rung has at most "
                         f"{MAX_RUNG_TOKENS} (the ladder drops a rung over an engine's stated context)")
    return RungSpec(f"{p}/{t}", p, t)


def parse_bar(value: object) -> dict[str, float]:
    """min_speed_ratio: a bare number is the decode bar; a table names decode / ttft / e2e."""
    table = {"decode": value} if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(table, dict):
        raise ValueError(f"min_speed_ratio must be a number or a table of {', '.join(BAR_KEYS)}, got {value!r}")
    out = {}
    for key, bar in table.items():
        if key not in BAR_KEYS:
            raise ValueError(f"min_speed_ratio: unknown figure {key!r}{did_you_mean(key, BAR_KEYS)} "
                             f"(known: {', '.join(BAR_KEYS)})")
        if isinstance(bar, bool) or not isinstance(bar, (int, float)) or not math.isfinite(bar) or bar <= 0:
            raise ValueError(f"min_speed_ratio.{key} must be a finite number > 0, got {bar!r}")
        out[key] = float(bar)
    return out


def _int(table: dict, key: str, default: int, low: int, line_of) -> int:
    v = table.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"[speed] {key} must be an integer >= {low}, got {v!r}", path=line_of.path, line=line_of(key))
    return v


def parse_speed(table: object, line_of, arms: Mapping[str, Any]) -> SpeedConfig:
    """Parse `[speed]`; line_of(key) gives a key's line and line_of.path the file. `arms` are the
    gate's parsed arms by role (gate/config.py's ArmConfig), checked by `_check_live`."""
    if not isinstance(table, dict):
        raise ConfigError("[speed] must be a table", path=line_of.path, line=line_of("speed"))
    for key in table:
        if key not in SPEED_KEYS:
            raise ConfigError(f"[speed] unknown key {key!r}{did_you_mean(key, SPEED_KEYS)} "
                              f"(known: {', '.join(sorted(SPEED_KEYS))})", path=line_of.path, line=line_of(key))
    rungs_raw = table.get("rungs", list(DEFAULT_RUNGS))
    conc_raw = table.get("concurrency", [1])
    try:
        if not isinstance(rungs_raw, list) or not rungs_raw:
            raise ValueError("rungs must be a non-empty list of strings")
        rungs = tuple(parse_rung(r) for r in rungs_raw)
        names = [r.name for r in rungs]
        if len(set(names)) != len(names):
            raise ValueError(f"rungs repeat a rung: {names}")
    except ValueError as e:
        raise ConfigError(f"[speed] {e}", path=line_of.path, line=line_of("rungs")) from None
    if (not isinstance(conc_raw, list) or not conc_raw
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in conc_raw)
            or len(set(conc_raw)) != len(conc_raw)):
        raise ConfigError(f"[speed] concurrency must be a list of distinct integers >= 1, got {conc_raw!r}",
                          path=line_of.path, line=line_of("concurrency"))
    try:
        bar = parse_bar(table["min_speed_ratio"]) if "min_speed_ratio" in table else {}
    except ValueError as e:
        raise ConfigError(f"[speed] {e}", path=line_of.path, line=line_of("min_speed_ratio")) from None
    speed = SpeedConfig(
        warmup=_int(table, "warmup", 1, 0, line_of),
        runs=_int(table, "runs", 5, 1, line_of),
        rungs=rungs,
        concurrency=tuple(conc_raw),
        min_speed_ratio=bar,
        seed=_int(table, "seed", 0, 0, line_of),
    )
    _check_live(arms, line_of)
    return speed


def _check_live(arms: Mapping[str, Any], line_of) -> None:
    """[speed] times live engines: a recorded candidate is refused; a recorded reference is stood
    in for by the [rescorer] only when that serves the same model."""
    line = line_of("speed")
    cand = arms.get("candidate")
    if cand is not None and not cand.engine_type.measurable:
        raise ConfigError("[speed] times live engines, and the [candidate] is a stored run (kind = \"recorded\"): "
                          "point [candidate] at a live engine, or drop [speed]", path=line_of.path, line=line)
    ref, rescorer = arms["reference"], arms.get("rescorer")
    if not ref.engine_type.measurable:
        model = getattr(ref.options, "model", None)
        if rescorer is None or not rescorer.engine_type.measurable or model is None \
                or getattr(rescorer.options, "model", None) != model:
            raise ConfigError(
                "[speed] times live engines, and the [reference] is a stored baseline (kind = \"recorded\"): "
                "point [reference] at a live engine, or give the gate a live [rescorer] with the same "
                "`model` as the recorded reference's `model` (it then stands in as the speed reference)",
                path=line_of.path, line=line)


def from_gate(ctx: TableContext) -> SpeedConfig | None:
    """The gate config's `[speed]` (core/features.py's registry calls it), None without one."""
    return parse_speed(ctx.data["speed"], ctx.lines.table("speed"), ctx.arms) if "speed" in ctx.data else None


def of(cfg: Any) -> SpeedConfig | None:
    """A gate config's speed settings (gate/config.py's GateConfig.features)."""
    s = cfg.feature("speed")
    return s if isinstance(s, SpeedConfig) else None
