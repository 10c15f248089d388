"""The gate config's `[golden]` table: a third engine's arm (kind, model, dtype, env, ... as any
arm takes them) and the two keys of its own, `blame` and `check_reference` (docs/golden.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strict_gate.core.features import TableContext
from strict_gate.core.options import Checked, NonNegativeInt, field_types, parse_options
from strict_gate.errors import ConfigError
from strict_gate.golden.variants import DEFAULT_CAP


@dataclass(frozen=True)
class GoldenKeys(Checked):
    blame: bool = False  # a failing gate whose every failing prompt has the reference off the golden exits 6
    check_reference: bool = False  # also score the reference's whole run through the golden (the health check)
    variant_votes: NonNegativeInt = DEFAULT_CAP  # [invariance] moves voted on at most (0: none)


OWN_KEYS = frozenset(field_types(GoldenKeys))


@dataclass(frozen=True)
class GoldenConfig:
    arm: Any  # gate/config.py's ArmConfig, role "golden"
    blame: bool = False
    check_reference: bool = False
    variant_votes: int = DEFAULT_CAP


def parse_golden(table: Any, ctx: TableContext) -> GoldenConfig:
    """A `[golden]` table: its own keys, then the rest as an arm (ctx.arm: the engine's options
    checked by its class before any model loads). A golden that is one of the arms is refused:
    it would vote for that arm by construction."""
    line_of = ctx.lines.table("golden")
    if not isinstance(table, dict):
        raise ConfigError(f"golden must be a [golden] table, got {table!r}", path=ctx.path, line=line_of("golden"))
    keys = parse_options(GoldenKeys, {k: v for k, v in table.items() if k in OWN_KEYS}, where="golden",
                         line_of=line_of, siblings=[k for k in table if k not in OWN_KEYS])
    arm = ctx.arm("golden", {k: v for k, v in table.items() if k not in OWN_KEYS})
    for role, other in ctx.arms.items():
        if role in ("reference", "candidate") and (other.kind, other.options, other.env) == (arm.kind, arm.options, arm.env):
            raise ConfigError(f"[golden] is the {role} arm itself (same kind, options and env): it would vote for "
                              f"the {role} by construction; run the model at a higher precision (dtype = \"float64\")",
                              path=ctx.path, line=line_of("kind"))
    if not arm.engine_type.can_score:
        raise ConfigError(f"[golden] kind {arm.kind!r} cannot score (teacher-forced logprobs): a golden votes by "
                          "scoring both arms' tokens", path=ctx.path, line=line_of("kind"))
    return GoldenConfig(arm, keys.blame, keys.check_reference, keys.variant_votes)


def from_gate(ctx: TableContext) -> GoldenConfig | None:
    """The gate config's `[golden]` (core/features.py's registry calls it), None without one."""
    return parse_golden(ctx.data["golden"], ctx) if "golden" in ctx.data else None


def of(cfg: Any) -> GoldenConfig | None:
    """A gate config's golden settings (gate/config.py's GateConfig.features)."""
    s = cfg.feature("golden")
    return s if isinstance(s, GoldenConfig) else None
