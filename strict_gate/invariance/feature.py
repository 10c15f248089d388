"""[invariance] in a gate: each named arm's batch-1 run and its variants, last, when every
engine of the gate is stopped (phase.py over run.py). Its runs go through the gate's runner
(`Gate.runs()`), so `gate --resume` keeps the ones an interrupted attempt finished."""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.core.redact import scrub_tree
from strict_gate.gate.feature import Feature
from strict_gate.gate.kept import Planned
from strict_gate.judge.result import GateResult, with_feature


@dataclass(frozen=True)
class Invariance(Feature):
    name = "invariance"

    def planned(self) -> tuple[Planned, ...]:
        """Every batch-1 and variant run, named for an interrupt's message."""
        from strict_gate.invariance.phase import planned_runs

        return planned_runs(self.gate.cfg, self.gate.inputs, self.gate.report.path)

    def last(self, result: GateResult) -> GateResult:
        """Their engine logs are scrubbed like the arms'."""
        from strict_gate.invariance.phase import invariance_phase

        g = self.gate
        try:
            return with_feature(result, self.name, invariance_phase(g.cfg, g.inputs, g.report.path, g.runs()))
        finally:
            scrub_tree(g.report.path)
