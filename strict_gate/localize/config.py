"""`localize = true | "all"` or a [localize] table, as the gate config reads it, and whether a
gate's arms can localise (`cannot_localize`, for the line a gate ends with): apart from
phase.py, which runs the localisation and reads the gate config back (relocalize), so that the
config and the phase do not import each other (the core of localize/, which gate/ imports)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from strict_gate.core.features import TableContext
from strict_gate.core.options import Checked, Parse, PositiveInt, parse_options
from strict_gate.errors import ConfigError, InputError
from strict_gate.judge.compare import Status
from strict_gate.localize.compare import check_tolerance
from strict_gate.localize.points import DEFAULT_POSITIONS, parse_points
from strict_gate.localize.run import DumpMode, Settings
from strict_gate.runs.records import EngineInfo


class Scope(StrEnum):
    DIVERGENT = "divergent"  # localize = true
    ALL = "all"  # and the near-ties

    @property
    def statuses(self) -> tuple[Status, ...]:
        return (Status.DIVERGENT,) if self is Scope.DIVERGENT else (Status.DIVERGENT, Status.NEAR_TIE)


@dataclass(frozen=True)
class LocalizeKeys(Checked):
    include: Annotated[Scope, Parse(Scope, takes=str)] = Scope.DIVERGENT
    positions: PositiveInt = DEFAULT_POSITIONS
    tolerance: float | None = None  # checked by check_tolerance
    points: list[str] | None = None
    graft: bool = True
    keep: bool = False
    narrow: bool = True
    mode: Annotated[DumpMode, Parse(DumpMode, takes=str)] = DumpMode.AUTO  # which path's dump is compared
    reference: dict | None = None


@dataclass(frozen=True)
class LocalizeConfig:
    scope: Scope
    settings: Settings
    reference: Any = None  # gate.config.ArmConfig of [localize.reference], or None


def parse_localize(value: Any, line_of, arm) -> LocalizeConfig | None:
    """`localize = true | false | "all"`, or a [localize] table; `arm(table)` reads its arm."""
    where = {"path": getattr(line_of, "path", None), "line": line_of("localize")}
    if value is False:
        return None
    if value is True or value == "all":
        return LocalizeConfig(Scope.ALL if value == "all" else Scope.DIVERGENT, Settings())
    if not isinstance(value, dict):
        raise ConfigError(f'localize must be true, false, "all" or a [localize] table, got {value!r}', **where)
    keys = parse_options(LocalizeKeys, value, where="localize", line_of=line_of)
    try:
        points = parse_points(",".join(keys.points), where="[localize] points") if keys.points is not None else None
    except InputError as e:
        raise ConfigError(str(e), path=where["path"], line=line_of("points")) from None
    try:
        tolerance = check_tolerance(keys.tolerance) if keys.tolerance is not None else None
    except ConfigError as e:
        raise ConfigError(f"[localize] {e}", path=where["path"], line=line_of("tolerance")) from None
    settings = Settings(points=points, positions=keys.positions, tolerance=tolerance, graft=keys.graft,
                        keep=keys.keep, narrow=keys.narrow, mode=keys.mode)
    return LocalizeConfig(keys.include, settings, arm(keys.reference) if keys.reference is not None else None)


def cannot_localize(cfg, reference: EngineInfo, candidate: EngineInfo) -> str | None:
    """Why `strict-gate localize` cannot run on this gate's report, or None when it can: the
    candidate dumps and an arm gives the reference's activations (phase.py's activation_reference, in its order),
    judged without starting an engine, from the arms' classes and what each engine said at the
    gate (`reference`, `candidate`: their EngineInfo)."""
    if cfg.candidate is None or not cfg.candidate.engine_type.could_dump(candidate):
        return f"the candidate ({cfg.candidate.kind if cfg.candidate else 'none'}) cannot dump activations"
    lc = of(cfg)
    if lc is not None and lc.reference is not None:
        return None if lc.reference.engine_type.can_dump else "the [localize.reference] arm cannot dump activations"
    if cfg.reference.engine_type.could_dump(reference):
        return None
    if cfg.rescorer is not None and cfg.rescorer.engine_type.can_dump:
        return None
    return (f"the reference ({cfg.reference.kind}) cannot dump activations and no [localize.reference] or "
            "dumping [rescorer] arm is configured")


def from_gate(ctx: TableContext) -> LocalizeConfig | None:
    """The gate config's `localize` key or [localize] table (core/features.py's registry calls it)."""
    if "localize" not in ctx.data:
        return None
    return parse_localize(ctx.data["localize"], ctx.lines.finder("localize"),
                          lambda t: ctx.arm("localize.reference", t))


def of(cfg: Any) -> LocalizeConfig | None:
    """A gate config's localisation settings (gate/config.py's GateConfig.features)."""
    s = cfg.feature("localize")
    return s if isinstance(s, LocalizeConfig) else None
