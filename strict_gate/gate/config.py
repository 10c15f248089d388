"""Gate configs (TOML): one file says which prompts, which two arms, which policy.

Every table goes through one mechanism (strict_gate.core.options): the top-level keys are
GateKeys, an arm's own keys ArmKeys and the rest of the arm the engine's own Options, each
a typed table whose types carry their rules. Unknown keys are errors with a "did you mean"
and the line they are on, and all of it is checked before any model is loaded.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from strict_gate.cluster.engine import driver_engine_class, ray_engine_class
from strict_gate.cluster.settings import RaySettings
from strict_gate.core.features import FEATURES, BandSource, TableContext, resolve
from strict_gate.core.options import Bound, Checked, Example, Parse, PositiveInt, field_types, parse_options
from strict_gate.core.redact import REDACTED, restore_env, unset_redacted
from strict_gate.engines import Engine, engine_class
from strict_gate.errors import ConfigError, StrictGateError, located
from strict_gate.judge.compare import DEFAULT_BAND, check_gate_band
from strict_gate.judge.policy import DEFAULT_POLICY, Policy, check_policy
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE
from strict_gate.runs.prompts import check_regular_file

MAX_CONFIG_BYTES = 16 * 1024 * 1024
TopLogprobs = Annotated[int, Bound(ge=2, why="near-ties are judged from the top alternatives")]


@dataclass(frozen=True)
class GateKeys(Checked):
    """A gate config's top-level keys; the four tables are read on their own (arms, [speed])."""

    prompts: Annotated[str, Example('"path/to/set.jsonl"')]
    reference: dict
    name: str | None = None  # None: the config file's stem
    max_tokens: PositiveInt = 16
    top_logprobs: TopLogprobs = 5
    policy: Annotated[Policy, Parse(check_policy, takes=str)] = DEFAULT_POLICY
    band: Annotated[float | str, Parse(check_gate_band)] = DEFAULT_BAND  # or "measured" (docs/noise.md)
    greedy_tolerance: Annotated[float, Bound(ge=0, unit="nats"), Parse(float)] = DEFAULT_GREEDY_TOLERANCE
    output_dir: str = "reports"
    diagnose: bool = True
    drift: bool = False
    candidate: dict | None = None
    rescorer: dict | None = None
    speed: dict | None = None
    invariance: dict | None = None
    noise: dict | None = None
    golden: dict | None = None


@dataclass(frozen=True)
class ArmKeys(Checked):
    """An arm's own keys; the rest of its table is the engine's options."""

    kind: Annotated[str, Example('"..."')]
    env: dict[str, str | int | float | bool] = field(default_factory=dict)
    runs: PositiveInt = 1


ARM_KEYS = frozenset(field_types(ArmKeys)) | {"ray"}  # [<role>.ray]: the arm served by Ray actors (cluster/)


@dataclass(frozen=True)
class ArmConfig:
    role: str  # reference | candidate
    kind: str
    options: Any  # the engine's Options dataclass instance
    env: dict[str, str] = field(default_factory=dict)
    runs: int = 1
    base_dir: Path = Path(".")
    path: str | None = None  # the config file, and the line of this arm's table in it
    line: int | None = None
    ray: RaySettings | None = None  # [<role>.ray]: its prompts served by Ray actors, one engine each

    @property
    def engine_type(self) -> type[Engine]:
        """The engine's class: its capability flags, before anything is built."""
        return engine_class(self.kind)

    def build(self) -> Engine:
        """The engine, constructed but not started (no model loaded yet); a refusal of its own
        (a tokenizer that is not there) names this arm's file and line, as a config error does."""
        try:
            if self.ray is not None:
                engine: Engine = ray_engine_class(self.engine_type)(self.options, self.env, self.base_dir,
                                                                    settings=self.ray)
            else:
                engine = self.engine_type(self.options, self.env, self.base_dir)
        except ConfigError as e:
            raise located(e, self.path, self.line) from None
        engine.configured_at = (self.path, self.line)
        return engine

    def build_in_driver(self) -> Engine:
        """One engine of the arm in this process, even when `[<role>.ray]` pools its gate run: for
        what drives one engine (invariance variants), its manifests saying "not pooled: ran in the
        driver process"; without a [ray] table, build()."""
        if self.ray is None:
            return self.build()
        try:
            engine = driver_engine_class(self.engine_type)(self.options, self.env, self.base_dir)
        except ConfigError as e:
            raise located(e, self.path, self.line) from None
        engine.configured_at = (self.path, self.line)
        return engine


@dataclass(frozen=True)
class GateConfig:
    name: str
    path: str
    prompts: Path
    max_tokens: int
    top_logprobs: int
    policy: Policy
    band: float
    output_dir: Path
    diagnose: bool
    reference: ArmConfig
    candidate: ArmConfig | None
    rescorer: ArmConfig | None = None  # scores divergences when the reference cannot (a stored baseline)
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE  # nats an arm's chosen token may sit below its top-1
    drift: bool = False  # teacher-force the reference's tokens through the candidate (strict_gate/drift/measure.py)
    # each enabled feature's parsed settings by name (core/features.py): [speed], localize,
    # [invariance], [noise], drift; each folder reads its own back (speed/config.py's `of`, ...)
    features: Mapping[str, Any] = field(default_factory=dict)

    def feature(self, name: str) -> Any:
        """The named feature's settings, None when the config leaves it off."""
        return self.features.get(name)

    @property
    def speed_reference(self) -> ArmConfig:
        """The arm timed as the speed reference: the reference, or for a recorded baseline the
        [rescorer] (a live engine of the same model, checked when the config is read)."""
        return self.rescorer if not self.reference.engine_type.measurable and self.rescorer else self.reference


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

    def table(self, table: str):
        """line_of for a feature's table: a key's line, else the table's header, else `table = ...`."""

        def line_of(key: str) -> int | None:
            return self.find(key, table) or self.header(table) or self.find(table)

        line_of.path = self.path  # type: ignore[attr-defined]
        return line_of

    def finder(self, table: str | None):
        def line_of(key: str) -> int | None:
            return self.find(key, table)

        line_of.path = self.path  # type: ignore[attr-defined]
        return line_of


def _arm(role: str, table: dict, lines: _Lines, base_dir: Path) -> ArmConfig:
    """An arm's table: its own keys (ArmKeys), then the rest as the engine's Options."""
    line_of = lines.finder(role)
    keys = parse_options(ArmKeys, {k: v for k, v in table.items() if k in ARM_KEYS and k != "ray"}, where=role,
                         line_of=line_of)
    try:
        cls = engine_class(keys.kind)
    except ConfigError as e:
        raise ConfigError(str(e), path=lines.path, line=lines.find("kind", role)) from None
    for name, value in keys.env.items():  # what exec would refuse, refused here: exit 2, not 3 at start
        if not name or "=" in name or "\0" in name or "\0" in str(value):
            raise ConfigError(f"[{role}.env] {name!r}: a variable name must be non-empty without '=' or NUL, "
                              "and a value without NUL", path=lines.path,
                              line=lines.find(name, f"{role}.env") or lines.find("env", role))
    if keys.runs > 1 and role != "reference":
        raise ConfigError("only the [reference] arm captures repeated runs", path=lines.path, line=lines.find("runs", role))
    opts = {k: v for k, v in table.items() if k not in ARM_KEYS}
    options = parse_options(cls.Options, opts, where=role, line_of=line_of, siblings=ARM_KEYS)
    cls.check_options(options, where=role, line_of=line_of)
    env = {k: ("1" if v is True else "0" if v is False else str(v)) for k, v in keys.env.items()}
    if unset := unset_redacted(env):
        name = unset[0]
        raise ConfigError(f'[{role}.env] {name} reads "{REDACTED}" (a report\'s copy of the config keeps no secret) '
                          f"and {name} is not set in the environment: export it as the gate ran with it; without "
                          "it the arm would be another engine configuration", path=lines.path,
                          line=lines.find(name, f"{role}.env") or lines.find("env", role))
    env = restore_env(env)
    ray = _ray(role, table.get("ray"), lines)
    if ray is not None and (why := cls.pool_refusal(options)):
        raise ConfigError(f"[{role}.ray] {why}", path=lines.path,
                          line=lines.header(f"{role}.ray") or lines.header("ray") or lines.find("ray", role))
    return ArmConfig(role, keys.kind, options, env, keys.runs, base_dir, lines.path,
                     lines.header(role) or lines.find("kind", role), ray)


def _ray(role: str, table: Any, lines: _Lines) -> RaySettings | None:
    """[<role>.ray], checked as the arm's own keys are (exit 2 naming the line)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"[{role}] ray must be a table ([{role}.ray])", path=lines.path, line=lines.find("ray", role))
    return parse_options(RaySettings, table, where=f"{role}.ray", line_of=lines.finder(f"{role}.ray"))


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
    keys = parse_options(GateKeys, {k: v for k, v in data.items() if k != "localize"}, where=None,
                         line_of=lines.finder(None), siblings=("localize",))
    if require_candidate and keys.candidate is None:
        raise ConfigError("needs a [candidate] table", path=path)
    prompts = Path(keys.prompts)
    arms: dict[str, ArmConfig] = {role: _arm(role, data[role], lines, base_dir) for role in ("reference", "candidate", "rescorer")
            if role in data}
    ctx = TableContext(data, path, keys.band, keys.max_tokens, prompts if prompts.is_absolute() else base_dir / prompts,
                       arms, lines, lambda role, t: _arm(role, t, lines, base_dir))
    features = _features(ctx)
    measured = [b for s in features.values() if isinstance(s, BandSource) and (b := s.measured_value()) is not None]
    return GateConfig(
        name=keys.name if keys.name is not None else Path(path).stem,
        path=path,
        prompts=prompts if prompts.is_absolute() else base_dir / prompts,
        max_tokens=keys.max_tokens,
        top_logprobs=keys.top_logprobs,
        policy=keys.policy,
        band=measured[0] if measured else keys.band,  # "measured" without a profile: noise refused it
        greedy_tolerance=keys.greedy_tolerance,
        output_dir=Path(keys.output_dir),
        diagnose=keys.diagnose,
        drift=keys.drift,
        reference=arms["reference"],
        candidate=arms.get("candidate"),
        rescorer=arms.get("rescorer"),
        features=features,
    )


def _features(ctx: TableContext) -> dict[str, Any]:
    """Each registered feature's table, parsed by its own folder, in the registry's order."""
    out = {}
    for f in FEATURES:
        if f.config is not None and (settings := resolve(f.config)(ctx)) is not None:
            out[f.name] = settings
    return out


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


def load_copied_config(path: Path, *, started: str | None, base_dir: Path | None,
                       require_candidate: bool = True) -> GateConfig:
    """A report's copy of its config (REPORT_DIR/gate.toml) under the name the gate ran with: a
    config without `name` is named after the file it was started from (`started`), not the copy."""
    cfg = load_gate_config(path, require_candidate=require_candidate, base_dir=base_dir)
    if started is None or "name" in tomllib.loads(path.read_text(encoding="utf-8")):
        return cfg
    return replace(cfg, name=Path(started).stem)


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
