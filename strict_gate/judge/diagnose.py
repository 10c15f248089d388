"""Teacher-forced re-scoring: is a divergence a near-tie, and is the rest downstream of it?

Both sides are re-scored where they can be: the reference scores the candidate's tokens
(below), and a candidate that can score scores its own tokens (every later position) and,
where that leaves its gap at the divergence unknown, the reference's tokens up to and including
the divergence (score_candidate), so the candidate's gap is known even where the reference's
token fell outside its decode top-k. cross_check then classifies each diverged prompt once,
from both sides (judge/compare.py's classify): the status and the diagnosis cannot disagree;
and it judges every later position (judge/cascade.py), which the near-tie policy requires.

The reference engine scores prompt + the CANDIDATE's tokens. Per position from the first
divergence: gap = max(0, lp_ref(argmax) - lp_ref(candidate token)) given the candidate's
own prefix. Gap 0 everywhere after the flip means every later token is what the reference
itself would pick on that prefix: one flip, and the rest is its consequence. A later gap
above zero is a second flip: a further near-tie when both sides' gaps are within the band,
else an independent error (cascade.py). A token outside the reference's top-k at the
divergence is a real forward bug, not a near-tie.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Protocol

from strict_gate.judge.cascade import CandidateView, Cascade, ScoredPosition, judge_later, unjudged
from strict_gate.judge.compare import (
    Comparison,
    Divergence,
    PromptComparison,
    Rescored,
    Status,
    reclassify,
    with_prompts,
)
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE
from strict_gate.runs.records import Record, ScoredStep

DIAGNOSED = (Status.DIVERGENT, Status.NEAR_TIE)


@dataclass(frozen=True)
class Diagnosis:
    id: str
    position: int  # the first divergence
    decode_gap: float | None  # from the reference's own decode logprobs (the comparator's reference_gap)
    rescored_gap: float | None  # from re-scoring the candidate's prefix: prefill may differ from decode
    rescored_argmax: int | None
    downstream_only: bool  # every later candidate token is the reference's argmax on the candidate prefix
    later_errors: tuple[int, ...]  # positions after the divergence with gap > 0 (or outside top-k)
    steps: tuple[ScoredPosition, ...]
    verdict: str  # one line for a reviewer
    error: str | None = None
    near_tie: bool = False  # the prompt's one classification (both sides, cross_check) is a near-tie
    candidate: Rescored | None = None  # the candidate's re-scored gap at the divergence, or why none
    later: Cascade | None = None  # every later position judged (cross_check)

    @property
    def short(self) -> str:
        """A few words for the console table."""
        if self.error is not None:
            return "re-scoring failed"
        c = self.candidate
        cand = "C unknown" if c is None or c.gap is None else f"C {c.gap:.3f}"
        ref = "R outside top-k" if self.rescored_gap is None else f"R {self.rescored_gap:.3f}"
        head = f"{'near-tie' if self.near_tie else 'real'} ({ref}, {cand})"
        lc = self.later
        if lc is None:
            return head + (", rest downstream" if self.downstream_only else f", later error at {self.later_errors[0]}")
        if lc.divergent:
            return head + f", later divergence at {lc.divergent[0].position}"
        if lc.unverified_from is not None:
            return head + f", unverified from {lc.unverified_from}"
        return head + (f", {lc.flip_count} later flip(s)" if lc.flip_count else ", rest downstream")

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "position": self.position,
            "decode_gap": self.decode_gap,
            "rescored_gap": self.rescored_gap,
            "rescored_argmax": self.rescored_argmax,
            "downstream_only": self.downstream_only,
            "later_errors": list(self.later_errors),
            "verdict": self.verdict,
            "near_tie": self.near_tie,
            "candidate_rescored": None if self.candidate is None else self.candidate.to_json(),
            "error": self.error,
            "later": None if self.later is None else self.later.to_json(),
            "steps": [
                {"position": s.position, "token": s.token, "gap": s.gap, "reference_argmax": s.reference_argmax}
                for s in self.steps
            ],
        }

def _gap(step: ScoredStep) -> float | None:
    if step.token_id == step.argmax:
        return 0.0
    lp = step.logprob
    if lp is None:
        lp = next((v for t, v in step.top if t == step.token_id), None)
    if lp is None:
        return None
    return max(0.0, step.top[0][1] - lp)


def diagnose_prompt(
    pc: PromptComparison, ref: Record, cand: Record, steps: list[ScoredStep], band: float
) -> Diagnosis:
    d = _divergence(pc).position
    scored = tuple(
        ScoredPosition(position=i, token=s.token_id, gap=_gap(s), reference_argmax=s.argmax)
        for i, s in enumerate(steps)
        if i >= d
    )
    at = scored[0] if scored else None
    later = tuple(s.position for s in scored[1:] if s.gap is None or s.gap > 0)
    downstream = not later
    verdict = "nothing to re-score" if at is None else _head(pc) + _tail(later)
    return Diagnosis(
        id=pc.id,
        position=d,
        decode_gap=_divergence(pc).reference_gap,
        rescored_gap=at.gap if at else None,
        rescored_argmax=at.reference_argmax if at else None,
        downstream_only=downstream,
        later_errors=later,
        steps=scored,
        verdict=verdict,
        near_tie=at is not None and at.gap is not None and at.gap <= band,
    )


def _divergence(pc: PromptComparison) -> Divergence:
    """A diverged prompt's first divergence (divergent and near-tie prompts always have one)."""
    if pc.first_divergence is None:
        raise ValueError(f"prompt {pc.id!r} ({pc.status}) has no divergence to re-score")
    return pc.first_divergence


def _head(pc: PromptComparison) -> str:
    """The diagnosis' first words: the prompt's classification (cross_check gives it both sides)."""
    d = _divergence(pc)
    word = "near-tie" if pc.status == Status.NEAR_TIE else "real divergence"
    return f"{word} at position {d.position} ({d.reason})"


AFTER_IT = "; after it: "  # a verdict's tail: the later positions' judgement (Cascade.summary)


def _tail(later: tuple[int, ...], cascade: Cascade | None = None) -> str:
    if cascade is not None:
        return f"{AFTER_IT}{cascade.summary()}"
    if not later:
        return "; every later token is the reference's argmax on the candidate's prefix (downstream of the flip)"
    return f"; independent later error(s) at position(s) {', '.join(map(str, later[:10]))}"


def without_later(verdict: str, summary: str | None) -> str:
    """A verdict without its later-positions tail, for a view that gives that judgement (`summary`,
    the cascade's) a line of its own: said once, not twice."""
    return verdict.removesuffix(f"{AFTER_IT}{summary}") if summary else verdict


def _reference_side(dg: Diagnosis | None) -> Rescored:
    if dg is None:
        return Rescored(None, "the reference did not re-score it")
    if dg.error is not None:
        return Rescored(None, f"the reference's re-scoring failed: {dg.error}")
    if not dg.steps:
        return Rescored(None, "the reference re-scored nothing at this position")
    if dg.rescored_gap is None:
        return Rescored(None, "the candidate's token is outside the reference's top-k on re-scoring", refutes=True)
    return Rescored(dg.rescored_gap)


@dataclass(frozen=True)
class CandidateScore:
    """The candidate's side of one diverged prompt: its gap at the divergence on the common
    prefix, and its scoring of its own tokens (every later position), or why there is none."""

    at: Rescored
    own: tuple[ScoredStep, ...] | None = None
    why: str | None = None  # why `own` is None


def _later(dg: Diagnosis, cand: Record | None, side: CandidateScore | None, band: float, not_scored: str,
           tolerance: float) -> Cascade:
    """Every candidate position after the divergence judged from the reference's re-scoring
    (dg.steps) and the candidate's own view (its decode top-k, its own scoring)."""
    end = len(cand.token_ids) if cand is not None else dg.position + 1
    if dg.error is not None:
        return unjudged(dg.position, end, f"the reference's re-scoring failed: {dg.error}")
    view = CandidateView(decode=(cand.top_logprobs or ()) if cand is not None else (),
                         scored=None if side is None else side.own,
                         why=not_scored if side is None else side.why)
    short = f"the reference re-scored {dg.position + len(dg.steps)} of {end} positions"
    return judge_later(dg.position, end, dg.steps[1:], band, candidate=view, why_short=short,
                       greedy_tolerance=tolerance)


def cross_check(comparison: Comparison, diagnoses: Mapping[str, Diagnosis], candidate: Mapping[str, CandidateScore],
                records: Mapping[str, Record], *, not_scored: str) -> tuple[Comparison, dict[str, Diagnosis]]:
    """Classify every diverged prompt once, from both sides' re-scored gaps (`candidate`: the
    candidate's, by prompt; a prompt without one is unknown on that side because of `not_scored`),
    judge every later position (`records`: the candidate's, for its decode top-k), and rewrite
    each diagnosis to say both."""
    changed, out = [], dict(diagnoses)
    for pc in comparison.prompts:
        if pc.status not in DIAGNOSED:
            continue
        side = candidate.get(pc.id)
        cand = side.at if side is not None else Rescored(None, not_scored)
        new = reclassify(pc, comparison.band, _reference_side(diagnoses.get(pc.id)), cand)
        changed.append(new)
        dg = diagnoses.get(pc.id)
        if dg is None:
            continue
        tolerance = pc.first_divergence.greedy_tolerance if pc.first_divergence else DEFAULT_GREEDY_TOLERANCE
        later = _later(dg, records.get(pc.id), side, comparison.band, not_scored, tolerance)
        if dg.error is None and dg.steps:
            out[pc.id] = replace(dg, near_tie=new.status == Status.NEAR_TIE, candidate=cand, later=later,
                                 verdict=_head(new) + _tail(dg.later_errors, later))
        else:
            out[pc.id] = replace(dg, candidate=cand, later=later)
    return with_prompts(comparison, changed), out


def stored_check(comparison: Comparison, diagnoses: Mapping[str, Diagnosis]) -> Comparison:
    """The classification a finished gate made, again, from its stored diagnoses (both sides'
    re-scored gaps as report.json holds them): what a resume or a re-localisation judges by
    when it loads no scoring engine, so that it reads the verdict the gate wrote."""
    changed = []
    for pc in comparison.prompts:
        dg = diagnoses.get(pc.id)
        if pc.status in DIAGNOSED and dg is not None:
            cand = dg.candidate if dg.candidate is not None else Rescored(None, "not stored in the report")
            changed.append(reclassify(pc, comparison.band, _reference_side(dg), cand))
    return with_prompts(comparison, changed)


def _lp(step: ScoredStep, token: int | None) -> float | None:
    if token == step.token_id and step.logprob is not None:
        return step.logprob
    return next((v for t, v in step.top if t == token), None)


def _candidate_gap(pc: PromptComparison, steps: Sequence[ScoredStep]) -> Rescored:
    """lp_C(c) - lp_C(r) at the divergence, from the candidate's scoring of the reference's tokens."""
    d = _divergence(pc)
    if len(steps) <= d.position:
        return Rescored(None, f"the candidate scored {len(steps)} of {d.position + 1} positions")
    step = steps[d.position]
    lp_r, lp_c = _lp(step, step.token_id), _lp(step, d.candidate_token)
    if lp_r is None:
        return Rescored(None, "the reference's token is outside the candidate's top-k on re-scoring", refutes=True)
    if lp_c is None:
        return Rescored(None, "the candidate's own token is outside its top-k on re-scoring", refutes=True)
    return Rescored(lp_c - lp_r)


def _own_gap(pc: PromptComparison, own: Sequence[ScoredStep]) -> Rescored | None:
    """The same gap from the candidate's scoring of its own tokens (the prefix before the
    divergence is common), or None when that scoring does not give both logprobs."""
    d = _divergence(pc)
    if len(own) <= d.position:
        return None
    lp_c, lp_r = _lp(own[d.position], d.candidate_token), _lp(own[d.position], d.reference_token)
    return Rescored(lp_c - lp_r) if lp_c is not None and lp_r is not None else None


def _score_one(pc: PromptComparison, ref: Record, cand: Record, engine: Scorer, k: int) -> CandidateScore:
    """One prompt's candidate side: its own tokens scored when there is a later position (one
    pass that also gives the gap at the divergence), the reference's up to the divergence
    only when that pass does not give it."""
    d = _divergence(pc).position
    own, why = None, "no candidate position after the divergence"
    if len(cand.token_ids) > d + 1:
        try:
            with engine.scoped_env():
                own = tuple(engine.score(cand.prompt_token_ids, cand.token_ids, k))
        except Exception as e:
            why = f"the candidate's re-scoring of its own tokens failed: {type(e).__name__}: {e}"
    at = _own_gap(pc, own) if own is not None else None
    if at is None:
        try:
            with engine.scoped_env():
                at = _candidate_gap(pc, engine.score(ref.prompt_token_ids, ref.token_ids[: d + 1], k))
        except Exception as e:
            at = Rescored(None, f"the candidate's re-scoring failed: {type(e).__name__}: {e}")
    return CandidateScore(at, own, None if own is not None else why)


def score_candidate(comparison: Comparison, reference: Mapping[str, Record], candidate: Mapping[str, Record],
                    engine: Scorer, k: int) -> dict[str, CandidateScore]:
    """Teacher-force each diverged prompt through the candidate: its gap at the divergence on
    the common prefix, and its own view of every later position. A failure is a stated unknown."""
    todo = [pc for pc in comparison.prompts if pc.status in DIAGNOSED]
    if not todo:
        return {}
    try:
        with engine.scoped_env():
            engine.start()
    except Exception as e:  # an unknown gap keeps the prompt divergent: fail closed
        why = f"the candidate did not start: {type(e).__name__}: {e}"
        return {pc.id: CandidateScore(Rescored(None, why), None, why) for pc in todo}
    return {pc.id: _score_one(pc, reference[pc.id], candidate[pc.id], engine, k) for pc in todo}


class Scorer(Protocol):
    """What diagnosis needs of a live engine (the gate passes one; the judge never builds one)."""

    def start(self) -> None: ...

    def scoped_env(self) -> AbstractContextManager[object]: ...

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]: ...


def diagnose(
    comparison: Comparison,
    reference: Mapping[str, Record],
    candidate: Mapping[str, Record],
    engine: Scorer,
    k: int,
) -> dict[str, Diagnosis]:
    """Re-score each divergent or near-tie prompt's candidate sequence with the reference engine."""
    out: dict[str, Diagnosis] = {}
    todo = [pc for pc in comparison.prompts if pc.status in DIAGNOSED]
    if not todo:
        return out
    try:  # started once: an engine that cannot start is not started again for every prompt
        with engine.scoped_env():
            engine.start()
    except Exception as e:  # a failed re-score is reported, it does not change the verdict
        return not_started(comparison, e)
    for pc in todo:
        ref, cand = reference[pc.id], candidate[pc.id]
        try:
            with engine.scoped_env():
                steps = engine.score(cand.prompt_token_ids, cand.token_ids, k)
        except Exception as e:
            out[pc.id] = _failed(pc, f"{type(e).__name__}: {e}")
            continue
        out[pc.id] = diagnose_prompt(pc, ref, cand, steps, comparison.band)
    return out


def not_started(comparison: Comparison, error: Exception) -> dict[str, Diagnosis]:
    """Each prompt diagnosis would re-score, failed because the engine did not start (once: a
    caller that tried to start it already says so here instead of starting it again)."""
    why = f"the engine did not start: {type(error).__name__}: {error}"
    return {pc.id: _failed(pc, why) for pc in comparison.prompts if pc.status in DIAGNOSED}


def _failed(pc, error: str) -> Diagnosis:
    d = pc.first_divergence
    return Diagnosis(pc.id, d.position, d.reference_gap, None, None, False, (), (), "re-scoring failed", error=error)
