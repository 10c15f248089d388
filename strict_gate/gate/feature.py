"""The feature interface: what a gate does beyond its two arms' verdict, one class per feature.

A feature (speed, drift, localisation, invariance, noise) reads its own part of the parsed
config (`settings`), and joins the gate at its named points, pytest-style: each hook defaults
to doing nothing, and the gate (`gate/run.py`) calls the enabled features at each point in
`FEATURES` order. Each hook says what is loaded when it runs: one engine is loaded at a
time, and a feature reuses what is loaded instead of loading it again. Speculative
decoding is no feature of its own: it is an [invariance] variant (`invariance/variants.py`,
the settings engines speak in `engines/speculative.py`). Each feature renders itself from its
own folder (its `SECTION`, named in report/sections.py's SECTIONS).

The features are imported only for a gate that runs (`"module:Class"`, as engines/ registers
engine kinds), so this module and `run.py` import none of their phases. A feature that lives
in one folder keeps its class there (`speed/feature.py`, `noise/feature.py`, `drift/feature.py`,
`localize/feature.py`, `invariance/feature.py`): its face, above gate/ and report/.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from strict_gate.core.features import FEATURES as REGISTRY
from strict_gate.core.features import resolve
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.gate.arm import finished_run
from strict_gate.gate.config import GateConfig
from strict_gate.gate.kept import Planned, Runs, Where
from strict_gate.gate.lifetimes import Lifetimes
from strict_gate.gate.outcome import ProgressHook
from strict_gate.gate.state import GateState
from strict_gate.judge.result import GateResult
from strict_gate.judge.spec import GateSpec
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import Run

# in the order their hooks run at each point: the one registry's order (core/features.py)
FEATURES: tuple[str, ...] = tuple(f.hooks for f in REGISTRY)


def build_rescorer(cfg: GateConfig, report_dir: Path) -> Engine:
    """The [rescorer] arm (not started); a process it runs logs to <report dir>/rescorer.log,
    which the report names (engines.rescorer), not to a temp file nobody finds."""
    if cfg.rescorer is None:
        raise TypeError("the gate config has no [rescorer] arm")
    engine = cfg.rescorer.build()
    engine.set_log_path(ReportDir(report_dir).rescorer_log)
    return engine


@dataclass(frozen=True)
class Gate:
    """What every phase of one gate reads: its settings, prompts, engines and report directory."""

    cfg: GateConfig
    spec: GateSpec
    ps: PromptSet
    inputs: list[PromptInput]
    report: ReportDir
    state: GateState  # its seal key; the verdicts are added to it when the gate finishes
    progress: ProgressHook | None
    prior: Mapping[str, Run]  # the runs an interrupted gate left, by role
    reference: Engine
    candidate: Engine
    owned: frozenset[str]  # the roles whose engines the gate closes (not handed in by a caller)
    built: dict[str, Engine] = field(default_factory=dict)  # the [rescorer], once built
    where: Where = field(default_factory=Where)  # how far it got, for an interrupt's message

    def engine(self, role: str) -> Engine:
        return self.reference if role == "reference" else self.candidate

    def done(self, role: str) -> Run | None:
        """The run an interrupted gate had finished for this arm (its engine is not started); one
        with an error reply, or a prompt missing, is continued: those prompts are generated again."""
        run = self.prior.get(role)
        return run if run is not None and finished_run(run, self.ps.ids) else None

    def runs(self) -> Runs:
        """What a phase makes its runs through (gate/kept.py): sealed with the gate's key, a
        finished one kept and an unfinished one continued when the gate is resumed."""
        return Runs(self.report, self.state, self.ps, self.spec.sampling, self.progress, self.where)

    def rescorer(self) -> Engine:
        """The [rescorer] arm, built once per gate: diagnosis and the speed arm's stand-in for a
        stored reference share one load."""
        if "rescorer" not in self.built:
            self.built["rescorer"] = build_rescorer(self.cfg, self.report.path)
        return self.built["rescorer"]


@dataclass(frozen=True)
class Feature:
    """One feature of one gate. `name` is its key in the gate config (GateConfig's field)."""

    name: ClassVar[str]
    gate: Gate

    @classmethod
    def settings(cls, cfg: GateConfig) -> object | None:
        """Its parsed settings (its own folder parsed its table: core/features.py), None when off."""
        return cfg.feature(cls.name)

    @classmethod
    def for_gate(cls, g: Gate) -> Feature | None:
        """This feature's part in gate `g`, None when it is off."""
        return cls(g) if cls.settings(g.cfg) is not None else None

    def planned(self) -> tuple[Planned, ...]:
        """The run directories this feature's phase writes, in the order it writes them: a feature
        that runs engines makes them through `self.gate.runs()`, so `--resume` keeps the finished
        ones and continues the rest, and an interrupt names them (gate/interrupt.py)."""
        return ()

    def after_candidate(self, engines: Lifetimes, run: Run) -> None:
        """The candidate's run is done and its engine still loaded; it is stopped after."""

    def after_verdict(self, ref_run: Run, result: GateResult) -> GateResult:
        """The verdict is made, divergences re-scored; the reference (or the [rescorer]) is loaded."""
        return result

    def after_cross(self, engines: Lifetimes, ref_run: Run, result: GateResult) -> GateResult:
        """The candidate's side of the divergences is scored: the candidate may still be loaded
        (the reference then stopped); it is stopped after."""
        return result

    def after_diagnosis(self, result: GateResult) -> GateResult:
        """The candidate is stopped, the reference may still be loaded: a feature starts what it needs."""
        return result

    def last(self, result: GateResult) -> GateResult:
        """Every engine of the gate is stopped."""
        return result

    def before_write(self, result: GateResult) -> GateResult:
        """Before the reports are written."""
        return result

    @classmethod
    def rejudge(cls, cfg: GateConfig, result: GateResult) -> GateResult | None:
        """A command that rewrites a finished report judged its tokens again (`diagnose`): this
        feature's section judged again from `result` alone, without an engine, when it hangs on the
        token verdict; None keeps the section as the gate wrote it (gate/rewrite.py)."""
        return None


def feature_classes() -> tuple[type[Feature], ...]:
    """The built-in features, imported here, in FEATURES order."""
    return tuple(resolve(spec) for spec in FEATURES)


def rejudged(cfg: GateConfig, result: GateResult) -> tuple[GateResult, frozenset[str]]:
    """`result` with every enabled feature's section that hangs on the token verdict judged again,
    and the names of those sections (the rewrite keeps every other one)."""
    redone: set[str] = set()
    for cls in feature_classes():
        if cls.settings(cfg) is not None and (new := cls.rejudge(cfg, result)) is not None:
            result = new
            redone.add(cls.name)
    return result, frozenset(redone)


def enabled(g: Gate) -> tuple[Feature, ...]:
    """The features gate `g`'s config turns on, each ready for the gate's hooks."""
    return tuple(f for cls in feature_classes() if (f := cls.for_gate(g)) is not None)
