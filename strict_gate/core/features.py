"""The one registry of a gate's features: speed, drift, localisation, invariance, noise, golden.

A feature lives in its own folder and owns everything of it: its config table and its phase
(its `Feature` class, gate/feature.py's hooks), its verdict (its result's `exit_code` and
`section_verdict`, judge/result.py's `FeatureResult`), its rendering in every format (its
`Section`, report/sections.py), its section's declared shape (`schema`: what is written is
checked against it, judge/schema.py `check_written`) and its re-loading from report.json
(`load`, so a command that rewrites a finished report keeps the section it did not redo:
gate/rewrite.py). Each is named
here as "module:attr" and imported only when first asked for, as engines/ registers engine
kinds, so gate/, judge/ and report/ import no feature folder. Adding a feature is its folder and
one line here (docs/architecture.md, "Adding a feature").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class FeatureEntry:
    """One feature's parts, each "module:attr" (an attr may be dotted: "Class.from_json")."""

    name: str  # its key in the gate config and in report.json's "features"
    hooks: str  # its gate/feature.py Feature subclass: its phase
    config: str | None  # (TableContext) -> its parsed settings, None when off; None: its Feature.settings reads them
    section: str  # its report/sections.py Section: its rendering, every format
    load: str | None  # (report.json's section dict) -> its result; None: it keeps nothing in report.json's features
    report_rank: int  # where its section stands in report.md (their order before this registry)
    schema: str | None = None  # the msgspec shape of its section: what is written is checked against it, and read through it


# In the order their hooks run at each point of the gate (the order the phases ran before they
# were features).
FEATURES: tuple[FeatureEntry, ...] = (
    FeatureEntry("speed", "strict_gate.speed.feature:Speed", "strict_gate.speed.config:from_gate",
                 "strict_gate.speed.render:SECTION", "strict_gate.speed.load:load_speed", 1,
                 "strict_gate.speed.load:SpeedSection"),
    FeatureEntry("drift", "strict_gate.drift.feature:Drift", None,  # one top-level key, `drift = true`: GateConfig.drift
                 "strict_gate.drift.render:SECTION", "strict_gate.drift.measure:DriftReport.from_json", 4,
                 "strict_gate.judge.schema:DriftDoc"),
    FeatureEntry("localize", "strict_gate.localize.feature:Localize", "strict_gate.localize.config:from_gate",
                 "strict_gate.localize.render:SECTION", None, 0),  # it annotates each prompt (GateResult.localization)
    FeatureEntry("invariance", "strict_gate.invariance.feature:Invariance", "strict_gate.invariance.config:from_gate",
                 "strict_gate.invariance.render:SECTION", "strict_gate.invariance.load:load_invariance", 2,
                 "strict_gate.invariance.load:InvarianceSection"),
    FeatureEntry("noise", "strict_gate.noise.feature:Noise", "strict_gate.noise.setting:from_gate",
                 "strict_gate.noise.render:SECTION", "strict_gate.noise.load:load_noise", 3,
                 "strict_gate.noise.load:NoiseSection"),
    FeatureEntry("golden", "strict_gate.golden.feature:Golden", "strict_gate.golden.config:from_gate",
                 "strict_gate.golden.render:SECTION", "strict_gate.golden.load:load_golden", 5,
                 "strict_gate.golden.load:GoldenSection"),  # last: it votes once every engine of the gate is stopped
)


@dataclass(frozen=True)
class TableContext:
    """What a feature's config parser reads of a gate config (gate/config.py builds it): the TOML,
    the top-level keys it may need, the parsed arms, and where each key is (its line)."""

    data: Mapping[str, Any]  # the whole TOML
    path: str  # the config file, for every error
    band: float | str  # the top-level band (a number, or "measured")
    max_tokens: int
    prompts: Path  # resolved
    arms: Mapping[str, Any]  # role -> gate/config.py's ArmConfig (reference, candidate, rescorer)
    lines: Any  # gate/config.py's line finder: find(key, table), finder(table), table(table)
    arm: Callable[[str, dict], Any]  # (role, table) -> an ArmConfig, for a feature's own arm ([localize.reference])


@runtime_checkable
class BandSource(Protocol):
    """A feature's settings that fix the gate's band (the noise profile's measured band)."""

    def measured_value(self) -> float | None: ...


def resolve(spec: str) -> Any:
    """ "module:attr.attr" -> the object, imported now."""
    module, _, path = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@cache
def by_name() -> dict[str, FeatureEntry]:
    return {f.name: f for f in FEATURES}


def entry(name: str) -> FeatureEntry | None:
    """The registered feature of that name, None for a name this version does not know."""
    return by_name().get(name)


__all__ = ["FEATURES", "FeatureEntry", "by_name", "entry", "resolve"]
