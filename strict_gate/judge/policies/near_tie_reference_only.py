"""Policy near-tie-reference-only: a divergence judged from the reference's side alone.

ONE-SIDED, WEAKER. The reference, teacher-forced on the candidate's tokens (judge/diagnose.py),
gives its gap lp_R(argmax) - lp_R(candidate's token) at the first divergence and at every later
position. The candidate passes when the gap at the divergence is known and within the band, and
every later position is judged by judge/cascade.py's judge_later with one_sided=True (the
every-token rule with the reference's gap alone): each follows or is within the band. This is
the bar for a text-only server, whose own margin cannot be known, and vllm.cpp's own gate. It
is weaker than near-tie: the candidate's own margin is never asked for, so a candidate whose own
logits put the reference's token far above its choice would still pass; every report says so in
its verdict line (the rule's caveat, ONE_SIDED).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from strict_gate.core.fmt import fmt_vs
from strict_gate.judge.cascade import Cascade, Later, judge_later
from strict_gate.judge.compare import BAND_EPS, Comparison, PromptComparison, Status
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.judge.policies.rule import Case, Rule, Ruling, diverged, exact

ONE_SIDED = ("one-sided and weaker: a divergence passes on the reference's re-scored gaps alone (within the band "
             "at the first divergence and every later position); the candidate's own gap is not known")


@dataclass(frozen=True)
class NearTieReferenceOnly(Rule):
    def judge(self, case: Case) -> Ruling:
        pc = case.prompt
        if pc.status == Status.MATCH:
            return exact(pc)
        if pc.status in (Status.DIVERGENT, Status.NEAR_TIE):
            return Ruling(*reference_only(pc, case.diagnosis, case.band))
        return diverged(pc)

    def diagnoses(self, comparison: Comparison, diagnoses: Mapping[str, Diagnosis]) -> dict[str, Diagnosis]:
        """Every report's later-position figures are the one-sided rule's (a two-sided cascade
        would call each later flip divergent for want of the candidate's gap)."""
        out = dict(diagnoses)
        for pc in comparison.prompts:
            dg = diagnoses.get(pc.id)
            if dg is not None and dg.error is None and dg.steps and pc.first_divergence is not None:
                out[pc.id] = replace(dg, later=_one_sided_later(pc, dg, comparison.band))
        return out


def reference_only(pc: PromptComparison, dg: Diagnosis | None, band: float) -> tuple[bool, str]:
    """(passes, why) for a diverged prompt under the one-sided rule."""
    d = pc.first_divergence
    if d is None or dg is None or not dg.steps:
        return False, ("one-sided: not re-scored by the reference (diagnosis off, or no [rescorer] for a stored "
                       "reference): its gaps are unknown")
    if dg.error is not None:
        return False, f"one-sided: the reference's re-scoring failed: {dg.error}"
    at = dg.steps[0]
    if at.gap is None:
        return False, (f"one-sided: at position {at.position} the candidate's token {at.token} is outside the "
                       f"reference's top-k (its argmax {at.reference_argmax})")
    if at.gap > band + BAND_EPS:
        g, b = fmt_vs(at.gap, band)
        return False, (f"one-sided: reference gap {g} > band {b} at position {at.position} (the first divergence; "
                       f"the candidate's token {at.token}, the reference's argmax {at.reference_argmax})")
    later = _one_sided_later(pc, dg, band)
    if later.outcome == Later.DIVERGENT:
        p = later.divergent[0]
        return False, (f"one-sided: at a later position {p.position} (the candidate's token {p.token}, the "
                       f"reference's argmax {p.reference_argmax}): {p.reason}; {later.counts()}")
    if later.outcome == Later.UNVERIFIED:
        return False, f"one-sided: {later.unverified}"
    return True, (f"one-sided near-tie at position {d.position}: reference gap {at.gap:.4g} <= band {band:g}; "
                  f"after it: {later.counts()}; the candidate's own gap is not known")


def _one_sided_later(pc: PromptComparison, dg: Diagnosis, band: float) -> Cascade:
    """The later positions judged on the reference's gaps alone (cascade.py's one-sided rule)."""
    assert pc.first_divergence is not None
    end, first = pc.candidate_length, pc.first_divergence.position
    short = f"the reference re-scored {first + len(dg.steps)} of {end} positions"
    return judge_later(first, end, dg.steps[1:], band, candidate=None, why_short=short, one_sided=True)


RULE = NearTieReferenceOnly(
    "near-tie-reference-only",
    "one-sided and weaker, a divergence passes on the reference's re-scored gaps alone (a text-only server)",
    one_sided=True, caveat=ONE_SIDED, judges_later=True)
