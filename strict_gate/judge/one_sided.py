"""Policy near-tie-reference-only: a divergence judged from the reference's side alone.

The reference, teacher-forced on the candidate's tokens (judge/diagnose.py), gives its gap
lp_R(argmax) - lp_R(candidate's token) at the first divergence and at every later position.
The candidate passes when each of those gaps is known and within the band: every token it
chose is one the reference itself ranks within the band of its own choice, on the candidate's
prefix. This is vllm.cpp's own bar. It is weaker than near-tie: the candidate's own margin is
never asked for (a text-only server cannot give it), so a candidate whose own logits put the
reference's token far above its choice would still pass; reports say so (policy.ONE_SIDED).
"""

from __future__ import annotations

from strict_gate.core.fmt import fmt_vs
from strict_gate.judge.compare import BAND_EPS, PromptComparison
from strict_gate.judge.diagnose import Diagnosis


def reference_only(pc: PromptComparison, dg: Diagnosis | None, band: float) -> tuple[bool, str]:
    """(passes, why) for a diverged prompt under the one-sided rule."""
    d = pc.first_divergence
    if d is None or dg is None:
        return False, ("one-sided: not re-scored by the reference (diagnosis off, or no [rescorer] for a stored "
                       "reference): its gaps are unknown")
    if dg.error is not None:
        return False, f"one-sided: the reference's re-scoring failed: {dg.error}"
    want = pc.candidate_length - d.position
    if len(dg.steps) < want:
        return False, f"one-sided: the reference re-scored {len(dg.steps)} of the {want} positions from {d.position}"
    for s in dg.steps:
        if s.gap is None:
            return False, (f"one-sided: at position {s.position} the candidate's token {s.token} is outside the "
                           f"reference's top-k (its argmax {s.reference_argmax})")
        if s.gap > band + BAND_EPS:
            g, b = fmt_vs(s.gap, band)
            where = "the first divergence" if s.position == d.position else "a later position"
            return False, (f"one-sided: reference gap {g} > band {b} at position {s.position} ({where}; the "
                           f"candidate's token {s.token}, the reference's argmax {s.reference_argmax})")
    first = dg.steps[0].gap if dg.steps else None
    later = max(dg.steps[1:], key=lambda s: s.gap or 0.0, default=None)
    tail = "" if later is None else f"; every later position within it (largest {later.gap:.4g} at {later.position})"
    return True, (f"one-sided near-tie at position {d.position}: reference gap {first:.4g} <= band {band:g}{tail}; "
                  "the candidate's own gap is not known")
