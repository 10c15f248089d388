"""`localize` in a gate: each divergent prompt localised along the depth (docs/localize.md),
after diagnosis and drift; it restarts the engines it needs, one at a time (phase.py)."""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.gate.feature import Feature
from strict_gate.judge.result import GateResult
from strict_gate.localize.config import of


@dataclass(frozen=True)
class Localize(Feature):
    name = "localize"

    def after_diagnosis(self, result: GateResult) -> GateResult:
        from strict_gate.localize.phase import localize_result

        g = self.gate
        lc = of(g.cfg)
        assert lc is not None  # for_gate made this feature for a config with localize
        return localize_result(g.cfg, result, g.reference, g.candidate, g.report.path, owned=set(g.owned),
                               scope=lc.scope, settings=lc.settings)
