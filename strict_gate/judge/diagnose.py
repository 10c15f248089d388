"""Teacher-forced re-scoring: is a divergence a near-tie, and is the rest downstream of it?

The reference engine scores prompt + the CANDIDATE's tokens. Per position from the first
divergence: gap = max(0, lp_ref(argmax) - lp_ref(candidate token)) given the candidate's
own prefix. Gap 0 everywhere after the flip means every later token is what the reference
itself would pick on that prefix: one flip, and the rest is its consequence. A later gap
above zero is an independent second error. A token outside the reference's top-k at the
divergence is a real forward bug, not a near-tie.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from strict_gate.judge.compare import Comparison, PromptComparison, Status
from strict_gate.runs.records import Record, ScoredStep

DIAGNOSED = (Status.DIVERGENT, Status.NEAR_TIE)


@dataclass(frozen=True)
class ScoredPosition:
    position: int
    token: int
    gap: float | None  # None: the token is outside the reference's top-k and the engine gave no logprob
    reference_argmax: int


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
    near_tie: bool = False  # the re-scored gap at the divergence is within the band

    @property
    def short(self) -> str:
        """A few words for the console table."""
        if self.error is not None:
            return "re-scoring failed"
        if self.rescored_gap is None:
            head = "real: outside top-k"
        else:
            head = f"{'near-tie' if self.near_tie else 'real'} (gap {self.rescored_gap:.3f})"
        if self.downstream_only:
            return head + ", rest downstream"
        return head + f", later error at {self.later_errors[0]}"

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
            "error": self.error,
            "steps": [
                {"position": s.position, "token": s.token, "gap": s.gap, "reference_argmax": s.reference_argmax}
                for s in self.steps
            ],
        }

    @classmethod
    def from_json(cls, d: dict) -> Diagnosis:
        """As to_json wrote it (a report rewritten without re-scoring keeps its diagnoses)."""
        steps = tuple(ScoredPosition(int(s["position"]), int(s["token"]), s.get("gap"), int(s["reference_argmax"]))
                      for s in d.get("steps") or ())
        return cls(id=str(d["id"]), position=int(d["position"]), decode_gap=d.get("decode_gap"),
                   rescored_gap=d.get("rescored_gap"), rescored_argmax=d.get("rescored_argmax"),
                   downstream_only=bool(d["downstream_only"]), later_errors=tuple(d.get("later_errors") or ()),
                   steps=steps, verdict=str(d["verdict"]), error=d.get("error"), near_tie=bool(d.get("near_tie")))


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
    assert pc.first_divergence is not None  # only a diverged prompt is diagnosed
    d = pc.first_divergence.position
    scored = tuple(
        ScoredPosition(position=i, token=s.token_id, gap=_gap(s), reference_argmax=s.argmax)
        for i, s in enumerate(steps)
        if i >= d
    )
    at = scored[0] if scored else None
    later = tuple(s.position for s in scored[1:] if s.gap is None or s.gap > 0)
    downstream = not later
    if at is None:
        verdict = "nothing to re-score"
    elif at.gap is None:
        verdict = (
            f"real divergence: the candidate's token at position {d} is outside the reference's top-k "
            "on the candidate's own prefix"
        )
    elif at.gap <= band:
        verdict = f"near-tie at position {d} (re-scored gap {at.gap:.4f} nats <= {band})"
    else:
        verdict = f"real divergence at position {d} (re-scored gap {at.gap:.4f} nats > {band})"
    if at is not None:
        if downstream:
            verdict += "; every later token is the reference's argmax on the candidate's prefix (downstream of the flip)"
        else:
            verdict += f"; independent later error(s) at position(s) {', '.join(map(str, later[:10]))}"
    return Diagnosis(
        id=pc.id,
        position=d,
        decode_gap=pc.first_divergence.reference_gap,
        rescored_gap=at.gap if at else None,
        rescored_argmax=at.reference_argmax if at else None,
        downstream_only=downstream,
        later_errors=later,
        steps=scored,
        verdict=verdict,
        near_tie=at is not None and at.gap is not None and at.gap <= band,
    )


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
        return {pc.id: _failed(pc, f"the engine did not start: {type(e).__name__}: {e}") for pc in todo}
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


def _failed(pc, error: str) -> Diagnosis:
    d = pc.first_divergence
    return Diagnosis(pc.id, d.position, d.reference_gap, None, None, False, (), (), "re-scoring failed", error=error)
