"""Gate configs (TOML): one file says which prompts, which two arms, which policy.

Unknown keys are errors with a "did you mean" and the line they are on; engine options
are checked against the engine's own Options before any model is loaded.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strict_gate.core.options import did_you_mean, parse_options
from strict_gate.core.redact import restore_env
from strict_gate.engines import engine_class
from strict_gate.errors import ConfigError, StrictGateError
from strict_gate.judge.compare import DEFAULT_BAND, check_band
from strict_gate.judge.policy import check_policy
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE
from strict_gate.runs.prompts import check_regular_file
from strict_gate.speed.config import SpeedConfig, parse_speed

GATE_KEYS = {
    "name", "prompts", "max_tokens", "top_logprobs", "policy", "band", "greedy_tolerance", "output_dir",
    "diagnose", "drift", "reference", "candidate", "rescorer", "speed",
}
MAX_CONFIG_BYTES = 16 * 1024 * 1024
ARM_KEYS = {"kind", "env", "runs"}  # the rest of an arm's table is the engine's options


@dataclass(frozen=True)
class ArmConfig:
    role: str  # reference | candidate
    kind: str
    options: Any  # the engine's Options dataclass instance
    env: dict[str, str] = field(default_factory=dict)
    runs: int = 1
    base_dir: Path = Path(".")

    def build(self):
        """The engine, constructed but not started (no model loaded yet)."""
        return engine_class(self.kind)(self.options, self.env, self.base_dir)


@dataclass(frozen=True)
class GateConfig:
    name: str
    path: str
    prompts: Path
    max_tokens: int
    top_logprobs: int
    policy: str
    band: float
    output_dir: Path
    diagnose: bool
    reference: ArmConfig
    candidate: ArmConfig | None
    rescorer: ArmConfig | None = None  # scores divergences when the reference cannot (a stored baseline)
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE  # nats an arm's chosen token may sit below its top-1
    drift: bool = False  # teacher-force the reference's tokens through the candidate (strict_gate/judge/drift.py)
    speed: SpeedConfig | None = None  # the speed arm ([speed], strict_gate/speed)

    @property
    def speed_reference(self) -> ArmConfig:
        """The arm timed as the speed reference: the reference, or for a recorded baseline the
        [rescorer] (a live engine of the same model, checked when the config is read)."""
        return self.rescorer if self.reference.kind == "recorded" and self.rescorer else self.reference


class _Lines:
    """Finds the line of a key in the TOML text (tomllib gives no positions for valid keys)."""

    def __init__(self, text: str, path: str):
        self.lines = text.splitlines()
        self.path = path

    def find(self, key: str, table: str | None = None) -> int | None:
        in_table = table is None
        for i, line in enumerate(self.lines, start=1):
            s = line.strip()
            if s.startswith("["):
                name = s.strip("[]").strip()
                in_table = table is None or name == table or name.startswith(table + ".")
                if table is not None and name == f"{table}.{key}":
                    return i
                continue
            if in_table and re.match(rf'^["\']?{re.escape(key)}["\']?\s*=', s):
                return i
        return None

    def header(self, table: str) -> int | None:
        """The line of a `[table]` header."""
        for i, line in enumerate(self.lines, start=1):
            if line.strip().startswith("[") and line.strip().strip("[]").strip() == table:
                return i
        return None

    def finder(self, table: str | None):
        def line_of(key: str) -> int | None:
            return self.find(key, table)

        line_of.path = self.path  # type: ignore[attr-defined]
        return line_of


def _arm(role: str, table: Any, lines: _Lines, base_dir: Path) -> ArmConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"[{role}] must be a table", path=lines.path, line=lines.find(role))
    kind = table.get("kind")
    if not isinstance(kind, str):
        raise ConfigError(f"[{role}] needs kind = \"...\"", path=lines.path, line=lines.find(role))
    try:
        cls = engine_class(kind)
    except ConfigError as e:
        raise ConfigError(str(e), path=lines.path, line=lines.find("kind", role)) from None
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float, bool)) for v in env.values()):
        raise ConfigError(f"[{role}.env] must map names to strings", path=lines.path, line=lines.find("env", role))
    for name, value in env.items():  # what exec would refuse, refused here: exit 2, not 3 at start
        if not name or "=" in name or "\0" in name or "\0" in str(value):
            raise ConfigError(f"[{role}.env] {name!r}: a variable name must be non-empty without '=' or NUL, "
                              "and a value without NUL", path=lines.path,
                              line=lines.find(name, f"{role}.env") or lines.find("env", role))
    runs = table.get("runs", 1)
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ConfigError(f"[{role}] runs must be an integer >= 1", path=lines.path, line=lines.find("runs", role))
    if runs > 1 and role != "reference":
        raise ConfigError("only the [reference] arm captures repeated runs", path=lines.path, line=lines.find("runs", role))
    opts = {k: v for k, v in table.items() if k not in ARM_KEYS}
    options = parse_options(cls.Options, opts, where=role, line_of=lines.finder(role))
    cls.check_options(options, where=role, line_of=lines.finder(role))
    env = restore_env({k: ("1" if v is True else "0" if v is False else str(v)) for k, v in env.items()})
    return ArmConfig(role, kind, options, env, runs, base_dir)


def _get(d: dict, key: str, types, default, lines: _Lines):
    v = d.get(key, default)
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)))
    if not ok:
        raise ConfigError(f"{key} = {v!r} has the wrong type", path=lines.path, line=lines.find(key))
    return v


def parse_gate_config(
    text: str, path: str, *, require_candidate: bool = True, base_dir: Path | None = None
) -> GateConfig:
    """Parse a gate config; relative paths resolve against base_dir (default: the file's folder)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise ConfigError(f"invalid TOML: {e}", path=path, line=int(m.group(1)) if m else None) from None
    lines = _Lines(text, path)
    base_dir = base_dir or Path(path).resolve().parent
    for key in data:
        if key not in GATE_KEYS:
            raise ConfigError(
                f"unknown key {key!r}{did_you_mean(key, GATE_KEYS)} (known: {', '.join(sorted(GATE_KEYS))})",
                path=path,
                line=lines.find(key),
            )
    if "prompts" not in data:
        raise ConfigError('needs prompts = "path/to/set.jsonl"', path=path)
    if "reference" not in data:
        raise ConfigError("needs a [reference] table", path=path)
    if require_candidate and "candidate" not in data:
        raise ConfigError("needs a [candidate] table", path=path)
    max_tokens = _get(data, "max_tokens", int, 16, lines)
    top_logprobs = _get(data, "top_logprobs", int, 5, lines)
    band = float(_get(data, "band", (int, float), DEFAULT_BAND, lines))
    if max_tokens < 1:
        raise ConfigError("max_tokens must be >= 1", path=path, line=lines.find("max_tokens"))
    if top_logprobs < 2:
        raise ConfigError(
            "top_logprobs must be >= 2: near-ties are judged from the top alternatives",
            path=path,
            line=lines.find("top_logprobs"),
        )
    try:
        check_band(band)
    except ValueError as e:
        raise ConfigError(str(e), path=path, line=lines.find("band")) from None
    greedy_tolerance = float(_get(data, "greedy_tolerance", (int, float), DEFAULT_GREEDY_TOLERANCE, lines))
    if not math.isfinite(greedy_tolerance) or greedy_tolerance < 0:
        raise ConfigError(
            f"greedy_tolerance must be a finite number >= 0 (nats), got {greedy_tolerance!r}",
            path=path,
            line=lines.find("greedy_tolerance"),
        )
    policy = _get(data, "policy", str, "auto", lines)
    try:
        check_policy(policy)
    except ConfigError as e:
        raise ConfigError(str(e), path=path, line=lines.find("policy")) from None
    prompts = Path(_get(data, "prompts", str, "", lines))
    arms = {role: _arm(role, data[role], lines, base_dir) for role in ("reference", "candidate", "rescorer")
            if role in data}
    speed = _speed(data["speed"], arms, lines) if "speed" in data else None
    return GateConfig(
        name=_get(data, "name", str, Path(path).stem, lines),
        path=path,
        prompts=prompts if prompts.is_absolute() else base_dir / prompts,
        max_tokens=max_tokens,
        top_logprobs=top_logprobs,
        policy=policy,
        band=band,
        greedy_tolerance=greedy_tolerance,
        output_dir=Path(_get(data, "output_dir", str, "reports", lines)),
        diagnose=_get(data, "diagnose", bool, True, lines),
        drift=_get(data, "drift", bool, False, lines),
        reference=arms["reference"],
        candidate=arms.get("candidate"),
        rescorer=arms.get("rescorer"),
        speed=speed,
    )


def _speed(table: Any, arms: dict[str, ArmConfig], lines: _Lines) -> SpeedConfig:
    """[speed], and the rule that it times live engines: a recorded candidate is refused; a
    recorded reference is stood in for by the [rescorer] only when that serves the same model."""

    def line_of(key: str) -> int | None:
        return lines.find(key, "speed") or lines.header("speed") or lines.find("speed")

    line_of.path = lines.path  # type: ignore[attr-defined]
    speed = parse_speed(table, line_of)
    where = {"path": lines.path, "line": line_of("speed")}
    cand = arms.get("candidate")
    if cand is not None and cand.kind == "recorded":
        raise ConfigError("[speed] times live engines, and the [candidate] is a stored run (kind = \"recorded\"): "
                          "point [candidate] at a live engine, or drop [speed]", **where)
    ref, rescorer = arms["reference"], arms.get("rescorer")
    if ref.kind == "recorded":
        model = getattr(ref.options, "model", None)
        if rescorer is None or rescorer.kind == "recorded" or model is None \
                or getattr(rescorer.options, "model", None) != model:
            raise ConfigError(
                "[speed] times live engines, and the [reference] is a stored baseline (kind = \"recorded\"): "
                "point [reference] at a live engine, or give the gate a live [rescorer] with the same "
                "`model` as the recorded reference's `model` (it then stands in as the speed reference)", **where)
    return speed


def load_gate_config(
    path: str | Path, *, require_candidate: bool = True, base_dir: Path | None = None
) -> GateConfig:
    p = Path(path)
    try:
        check_regular_file(p, "a gate config (a .toml file)", MAX_CONFIG_BYTES)
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("config not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config: {e}", path=str(path)) from None
    return parse_gate_config(text, str(path), require_candidate=require_candidate, base_dir=base_dir)


def load_arm_config(path: str | Path, role: str = "engine") -> ArmConfig:
    """An engine config on its own (for `strict-gate run`): a TOML table of kind, env and options.

    Accepts either a bare engine table or a gate config (then its [reference] is used).
    """
    p = Path(path)
    try:
        check_regular_file(p, "an engine config (a .toml file)", MAX_CONFIG_BYTES)
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError("engine config not found", path=str(path)) from None
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise ConfigError(f"invalid TOML: {e}", path=str(path), line=int(m.group(1)) if m else None) from None
    except (OSError, UnicodeDecodeError) as e:
        raise StrictGateError(f"cannot read engine config: {e}", path=str(path)) from None
    lines = _Lines(text, str(path))
    if "kind" not in data and isinstance(data.get("reference"), dict):
        return _arm("reference", data["reference"], lines, p.resolve().parent)
    return _arm(role, data, _TopLevel(text, str(path)), p.resolve().parent)


class _TopLevel(_Lines):
    """Line lookups for a bare engine file, whose keys sit at the top level."""

    def find(self, key: str, table: str | None = None) -> int | None:
        return super().find(key, None)
