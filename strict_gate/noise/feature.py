"""The reference's noise in a gate ([noise], band = "measured"): each candidate flip placed
against the profile, before the reports are written (setting.py)."""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.gate.config import GateConfig
from strict_gate.gate.feature import Feature
from strict_gate.judge.result import GateResult
from strict_gate.noise.setting import of, with_noise


@dataclass(frozen=True)
class Noise(Feature):
    name = "noise"

    def before_write(self, result: GateResult) -> GateResult:
        return with_noise(result, of(self.gate.cfg))

    @classmethod
    def rejudge(cls, cfg: GateConfig, result: GateResult) -> GateResult | None:
        """The candidate's flips placed again: re-scoring can turn a divergence into a near-tie."""
        return with_noise(result, of(cfg))
