"""The [speed] arm in a gate: each arm timed on the engine its token run just used (bench.py)."""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.engines.base import Engine
from strict_gate.gate.feature import Feature, Gate
from strict_gate.gate.lifetimes import Lifetimes
from strict_gate.judge.result import GateResult, with_feature
from strict_gate.runs.records import Run
from strict_gate.speed.bench import SpeedSession, gate_speed, timed_run


@dataclass(frozen=True)
class Speed(Feature):
    name = "speed"
    session: SpeedSession
    reference: Engine  # the engine timed as the reference: the reference, or the [rescorer]

    @classmethod
    def for_gate(cls, g: Gate) -> Speed | None:
        session, reference = gate_speed(g.cfg, g.inputs, g.reference, g.candidate, g.rescorer)
        return None if session is None or reference is None else cls(g, session, reference)

    def after_candidate(self, engines: Lifetimes, run: Run) -> None:
        g = self.gate
        timed_run(self.session, "candidate", g.candidate, run, g.report.arm("candidate").path)

    def after_verdict(self, ref_run: Run, result: GateResult) -> GateResult:
        """The reference side, timed on the engine still loaded, and the speed verdict."""
        g = self.gate
        timed_run(self.session, "reference", self.reference, ref_run if self.reference is g.reference else None,
                  g.report.arm("reference").path)
        return with_feature(result, self.name, self.session.result())
