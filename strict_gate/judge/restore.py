"""A finished gate's judgements back from report.json's declared shapes (judge/schema.py), so a
command that rewrites a report (diagnose, localize, resume) keeps the diagnoses and
localisations it did not redo. What the writer derived (a summary, a first-beyond name) is
derived again, never read."""

from __future__ import annotations

from strict_gate.judge.cascade import Cascade, LaterPosition, ScoredPosition
from strict_gate.judge.compare import Rescored
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.judge.localization import Alone, Localization, PointDiff, Reproduction
from strict_gate.judge.schema import (
    CascadeDoc,
    DiagnosisDoc,
    LaterPositionDoc,
    LocalizationDoc,
    PointDiffDoc,
    ReproductionDoc,
    RescoredDoc,
)


def rescored(d: RescoredDoc | None) -> Rescored | None:
    return None if d is None else Rescored(gap=d.gap, why=d.why, refutes=d.refutes)


def later_position(d: LaterPositionDoc) -> LaterPosition:
    return LaterPosition(d.position, d.token, d.reference_argmax, d.reference_gap, d.candidate_gap,
                         d.candidate_rescored, d.kind, d.reason)


def cascade(d: CascadeDoc) -> Cascade:
    return Cascade(first=d.first, end=d.end, judged=d.judged,
                   flips=tuple(later_position(p) for p in d.flip_positions), flip_count=d.flips,
                   divergent=tuple(later_position(p) for p in d.divergent_positions), divergent_count=d.divergent,
                   worst_gap=d.worst_gap, unverified_from=d.unverified_from, why=d.why,
                   candidate_note=d.candidate_note, one_sided=d.one_sided, prefill_decode=tuple(d.prefill_decode))


def diagnosis(d: DiagnosisDoc) -> Diagnosis:
    return Diagnosis(
        id=d.id, position=d.position, decode_gap=d.decode_gap, rescored_gap=d.rescored_gap,
        rescored_argmax=d.rescored_argmax, downstream_only=d.downstream_only, later_errors=tuple(d.later_errors),
        steps=tuple(ScoredPosition(s.position, s.token, s.gap, s.reference_argmax) for s in d.steps),
        verdict=d.verdict, error=d.error, near_tie=bool(d.near_tie), candidate=rescored(d.candidate_rescored),
        later=None if d.later is None else cascade(d.later),
    )


def point(d: PointDiffDoc) -> PointDiff:
    return PointDiff(name=d.name, max_abs=d.max_abs, rel_diff=d.rel_diff, cosine=d.cosine, scale=d.scale,
                     beyond=d.beyond, note=d.note)


def reproduction(d: ReproductionDoc) -> Reproduction:
    return Reproduction(arm=d.arm, token=d.token, chosen=d.chosen, source=d.source, path=d.path)


def localization(d: LocalizationDoc) -> Localization:
    return Localization(
        prompt_id=d.prompt_id, positions=tuple(d.positions), points=tuple(point(p) for p in d.points),
        first_beyond=d.first_beyond, tolerance=d.tolerance, reference_engine=d.reference_engine,
        candidate_engine=d.candidate_engine, grafted=tuple(point(p) for p in d.grafted),
        reference_note=d.reference_note, error=d.error, kept=d.kept,
        reproduction=tuple(reproduction(r) for r in d.reproduction), ops=tuple(point(p) for p in d.ops),
        ops_grafted=tuple(point(p) for p in d.ops_grafted),
        alone=tuple((op, Alone(v)) for op, v in d.alone.items()),
        op_graft_note=d.op_graft_note, op_graft_refused=d.op_graft_refused, dump_mode=d.dump_mode,
        decode=None if d.decode is None else localization(d.decode),
    )
