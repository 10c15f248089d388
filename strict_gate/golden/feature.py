"""The golden in a gate ([golden]): once every engine of the gate is stopped, the golden is
started (one engine loaded at a time), votes at each first divergence, checks the reference's own
tokens when `check_reference` asks, and is stopped, into <report dir>/golden.log."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.engines.base import Engine
from strict_gate.gate.config import GateConfig
from strict_gate.gate.feature import Feature
from strict_gate.golden.config import GoldenConfig, of
from strict_gate.golden.load import load_golden
from strict_gate.golden.result import GoldenResult
from strict_gate.golden.run import check_reference, diverged, failing, started, vote_all
from strict_gate.golden.variants import Move, VariantVotes, vote_moves
from strict_gate.invariance.verdict import InvarianceResult
from strict_gate.judge.result import GateResult, with_feature
from strict_gate.judge.stored import load_report


def variant_moves(result: GateResult) -> tuple[Move, ...] | None:
    """Every prompt an [invariance] variant moved where both runs emitted a token, in the result's
    order (arm, variant, prompt); None when the gate ran no variant."""
    inv = result.feature("invariance")
    if not isinstance(inv, InvarianceResult):
        return None
    return tuple(Move(v.arm, v.name, m.id, m.position, m.baseline_tokens[: m.position], m.baseline_token,
                      m.variant_token)
                 for v in inv.variants for m in v.divergences
                 if m.position is not None and m.baseline_token is not None and m.variant_token is not None
                 and m.baseline_token != m.variant_token and len(m.baseline_tokens) > m.position)


def golden_section(gc: GoldenConfig, result: GateResult, log: Path) -> GoldenResult:
    """The golden's section of a judged gate; the golden started (once) only when it has work,
    and stopped on every way out."""
    prompts = diverged(result.comparison.prompts)
    fail, band = failing(result.verdict), result.comparison.band
    moves = variant_moves(result)
    if not prompts and not gc.check_reference and not (moves and gc.variant_votes):
        return GoldenResult(None, gc.blame, band, fail, (),
                            variants=None if moves is None else VariantVotes(gc.variant_votes, len(moves), (), band))
    engine: Engine = gc.arm.build()
    engine.set_log_path(log)
    with engine_log(log, engine.log_libraries):
        try:
            why = started(engine)
            votes = vote_all(engine, prompts, result.reference_records, why)
            ids = [p.id for p in result.comparison.prompts]
            health = (check_reference(engine, result.reference_records, ids, band, why)
                      if gc.check_reference else None)
            variants = None if moves is None else vote_moves(engine, moves, result.reference_records,
                                                              gc.variant_votes, why, band)
            info = engine.info() if why is None else None
        finally:
            engine.close()
    return GoldenResult(info, gc.blame, band, fail, votes, health, () if why is None else (why,), variants)


@dataclass(frozen=True)
class Golden(Feature):
    name = "golden"

    def last(self, result: GateResult) -> GateResult:
        gc = of(self.gate.cfg)
        assert gc is not None  # for_gate: on only with a [golden] table
        return with_feature(result, self.name, golden_section(gc, result, self.gate.report.golden_log))

    @classmethod
    def rejudge(cls, cfg: GateConfig, result: GateResult) -> GateResult | None:
        """The votes the gate wrote kept (same tokens, same divergences: the golden is not started
        again), the failing prompts read again from the new token verdict, so that `blame` judges
        the verdict the rewritten report states, not the one it replaces."""
        old = stored(Path(result.runs["reference"]).parent) if "reference" in result.runs else None
        return None if old is None else with_feature(result, cls.name, replace(old, failing=failing(result.verdict)))


def stored(report_dir: Path) -> GoldenResult | None:
    """The golden's section of the report in `report_dir`, None when it has none."""
    doc = load_report(report_dir)
    section = doc.features.get(Golden.name)
    return None if section is None else load_golden(section.section)
