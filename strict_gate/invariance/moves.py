"""The candidate judged against the reference's own moves, under each variant both arms ran.

vLLM's own tokens move with some variants (Kimi-Linear's greedy tokens change with where its
prefill is cut: 16 of 48 prompts at a cut every 16 tokens on an H100, all near-ties), so a
candidate that moves exactly where vLLM moves has found nothing. With `arms = ["candidate",
"reference"]` each prompt of a variant is classified by the pair of moves (`Pairing`):

- moves with the reference: both moved the same way (`same_way`);
- the candidate moves where the reference stays: the finding;
- the reference moves, the candidate does not: the reference's move, shown, never counted
  against the candidate;
- both move differently: a finding.

The candidate's variant is judged by the policy on its own moves alone: every move but those
that move with the reference. A prompt the reference's variant did not measure (missing,
errored) excuses nothing: the candidate's move there is judged as when only it ran. The
reference's variant is the yardstick: a move of its own that would fail it reads `yardstick`,
never a failure. When only one arm ran, nothing here applies.
"""

from __future__ import annotations

from dataclasses import replace

from strict_gate.invariance.config import InvariancePolicy
from strict_gate.invariance.verdict import InvarianceResult, Moved, Pairing, VariantResult, VariantVerdict, fails
from strict_gate.judge.compare import UNCOMPARED

CANDIDATE, REFERENCE = "candidate", "reference"


def same_way(c: Moved, r: Moved) -> bool:
    """The same move: the same first moved position, the same batch-1 token there, and every
    token the variant emitted the same (so the candidate emits exactly the reference's tokens
    under the variant, the tool's one claim, there as at batch 1). Over repeats the candidate's
    reported run must say all of its moves (it moved one way: `outputs` 2); the reference's is
    its furthest move."""
    return (c.position is not None and c.position == r.position and c.baseline_token == r.baseline_token
            and c.variant_tokens == r.variant_tokens and c.outputs <= 2)


def pairing(c: Moved | None, r: Moved | None) -> Pairing | None:
    """One prompt's class; None when neither arm moved, or a side did not measure it."""
    if (c is not None and c.status in UNCOMPARED) or (r is not None and r.status in UNCOMPARED):
        return None
    if c is None:
        return None if r is None else Pairing.REFERENCE_ONLY
    if r is None:
        return Pairing.CANDIDATE_ONLY
    return Pairing.WITH_REFERENCE if same_way(c, r) else Pairing.DIFFERENTLY


def own_moves(v: VariantResult) -> tuple[Moved, ...]:
    """The candidate's moves its verdict counts: all of them, less those that move with the reference."""
    return tuple(m for m in v.divergences if v.pairing(m.id) != Pairing.WITH_REFERENCE)


def _beside(c: VariantResult, r: VariantResult, policy: InvariancePolicy) -> VariantResult:
    """The candidate's variant classified beside the reference's, judged on its own moves."""
    mine, theirs = {m.id: m for m in c.divergences}, {m.id: m for m in r.divergences}
    pairs = tuple((pid, k) for pid in dict.fromkeys([*mine, *theirs])
                  if (k := pairing(mine.get(pid), theirs.get(pid))) is not None)
    out = replace(c, pairs=pairs, reference_moves=r.divergences)
    if out.verdict != VariantVerdict.FAIL:  # a move shared never turns a pass or an incomplete run into anything
        return out
    if any(fails(m.status, policy, c.exact) for m in own_moves(out)):
        return out
    # a failing variant carries no runner problem: what it carries are near-ties left unjudged
    return replace(out, verdict=VariantVerdict.INCOMPLETE if c.problems else VariantVerdict.PASS)


def paired(inv: InvarianceResult) -> InvarianceResult:
    """`inv` with each candidate variant judged against the reference's of the same name, and
    the reference's moves as the yardstick; `inv` itself when both arms did not run."""
    by_arm: dict[str, dict[str, VariantResult]] = {CANDIDATE: {}, REFERENCE: {}}
    for v in inv.variants:
        by_arm.setdefault(v.arm, {})[v.name] = v
    if not by_arm[CANDIDATE] or not by_arm[REFERENCE]:
        return inv
    out = []
    for v in inv.variants:
        if v.arm == CANDIDATE and (r := by_arm[REFERENCE].get(v.name)) is not None and r.runs and v.runs:
            v = _beside(v, r, inv.policy)
        elif v.arm == REFERENCE and v.name in by_arm[CANDIDATE] and v.verdict == VariantVerdict.FAIL:
            v = replace(v, verdict=VariantVerdict.YARDSTICK)
        out.append(v)
    return replace(inv, variants=tuple(out))
