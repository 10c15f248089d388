"""`drift = true` in a gate: the candidate teacher-forced along every reference token sequence
(measure.py). With a stored reference, whose tokens are known before the gate, on the
candidate's engine right after its run (no extra load); with a live reference, once the
reference is stopped, on the candidate the cross-scoring left loaded or restarted for it.
Drift informs; it never changes the verdict."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from strict_gate.drift.measure import DriftReport, measure_drift
from strict_gate.engines.recorded import RecordedEngine
from strict_gate.gate.config import GateConfig
from strict_gate.gate.feature import Feature
from strict_gate.gate.lifetimes import Lifetimes
from strict_gate.judge.result import GateResult, with_feature
from strict_gate.runs.records import Record, Run


@dataclass(frozen=True)
class Drift(Feature):
    name = "drift"
    notes: list[str] = field(default_factory=list)  # why drift was not measured, in words
    measured: list[DriftReport] = field(default_factory=list)  # a stored reference's, from after_candidate

    @classmethod
    def settings(cls, cfg: GateConfig) -> object | None:
        return True if cfg.drift else None

    def after_candidate(self, engines: Lifetimes, run: Run) -> None:
        g = self.gate
        if g.reference.replays_run:
            assert isinstance(g.reference, RecordedEngine)  # the engine that replays a run
            if (drift := self._pass(g.reference.run.records)) is not None:
                self.measured.append(drift)

    def after_cross(self, engines: Lifetimes, ref_run: Run, result: GateResult) -> GateResult:
        """With a live reference: stop it and restart the candidate to score the reference's tokens
        (one engine at a time). The drift, measured here or after the candidate, joins the result."""
        g = self.gate
        drift = self.measured[0] if self.measured else None
        if not g.reference.replays_run:
            engines.close(g.reference)
            engines.reopen(g.candidate)
            drift = self._pass(ref_run.records)
            engines.close(g.candidate)
        if drift is not None:
            drift = drift.with_divergences(
                {p.id: p.first_divergence.position for p in result.comparison.prompts if p.first_divergence}
            )
        return replace(with_feature(result, self.name, drift), notes=result.notes + tuple(self.notes))

    def _pass(self, ref_records: Mapping[str, Record]) -> DriftReport | None:
        """Teacher-force every reference token sequence through the candidate. A candidate that
        cannot score, or fails to start, gives no drift, stated in a note."""
        g = self.gate
        candidate = g.candidate
        if not candidate.can_score:
            self.notes.append(f"drift not measured: the candidate engine ({candidate.kind}) cannot score")
            return None
        on_record = g.progress("drift (candidate scores the reference)", len(g.ps.ids)) if g.progress else None
        k = g.spec.sampling.top_logprobs

        def score(ref):
            t0 = time.perf_counter()
            try:
                return candidate.score(ref.prompt_token_ids, ref.token_ids, k)
            finally:
                if on_record is not None:
                    on_record(ref, time.perf_counter() - t0)

        with candidate.scoped_env():
            t0 = time.perf_counter()
            try:
                candidate.start()
            except Exception as e:
                self.notes.append(f"drift not measured: the candidate engine did not start: {type(e).__name__}: {e}")
                return None
            t1 = time.perf_counter()
            drift = measure_drift(ref_records, g.ps.ids, score, k=k, band=g.spec.band,
                                  scored_by=f"{candidate.kind} {candidate.info().model}")
        return replace(drift, seconds={"start": t1 - t0, "score": time.perf_counter() - t1})
