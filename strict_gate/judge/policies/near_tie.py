"""Policy near-tie: every prompt matches, or diverges at a near-tie (both gaps within the band)
after which EVERY later candidate token, judged on the candidate's own prefix
(judge/cascade.py), is the reference's argmax there or a further near-tie.

A near-tie whose later positions could not all be judged (no re-scoring: diagnose = false, a
stored reference without [rescorer], a failed rescorer, fewer steps scored) is unverified:
never a pass, counted with the incomplete verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.judge.cascade import Cascade, Later
from strict_gate.judge.compare import PromptComparison, Status
from strict_gate.judge.policies.rule import Case, Rule, Ruling, diverged, exact

UNJUDGED = ("no engine re-scored the candidate's continuation (diagnose = false, or a reference that cannot "
            "score and no [rescorer])")


@dataclass(frozen=True)
class NearTie(Rule):
    def judge(self, case: Case) -> Ruling:
        pc = case.prompt
        if pc.status == Status.MATCH:
            return exact(pc)
        if pc.status == Status.NEAR_TIE:
            d = pc.first_divergence
            assert d is not None  # a near-tie has its divergence
            return _near_tie(pc, f"near-tie at position {d.position}: {d.reason}", case.later)
        return diverged(pc)


def _near_tie(pc: PromptComparison, head: str, later: Cascade | None) -> Ruling:
    """A first divergence that is a near-tie passes only when every later position follows or is
    a further near-tie; one that could not be judged leaves the prompt unverified."""
    d = pc.first_divergence
    assert d is not None
    end = pc.candidate_length
    if later is None and end > d.position + 1:
        span = f"position {d.position + 1}" if end == d.position + 2 else f"positions {d.position + 1}-{end - 1}"
        return Ruling(False, f"unverified: {head}; {span} after the flip not judged: {UNJUDGED}", unverified=True)
    if later is None:
        return Ruling(True, f"{head}; no position after it")
    outcome = later.outcome
    if outcome == Later.DIVERGENT:
        p = later.divergent[0]
        return Ruling(False, f"divergent after a near-tie: later position {p.position}, token {p.token} vs the "
                      f"reference's argmax {p.reference_argmax}: {p.reason} ({head}; {later.counts()})")
    if outcome == Later.UNVERIFIED:
        return Ruling(False, f"unverified: {head}; {later.summary()}", unverified=True)
    return Ruling(True, f"{head}; {later.summary()}")


RULE = NearTie("near-tie", "equal, or a near-tie at the first divergence and every later token judged",
               judges_later=True)
