"""How far two arms already disagreed before they flipped a token: the scale of a near-tie.

A near-tie between two float32 builds is a reduction-order accident (|Δ logprob| ~1e-5 at the
positions both arms chose alike); the same label on a Q8_0 build hides that every logprob
was already off by ~0.3 nats, so the "tie" says little about correctness. Both arms report
the chosen token's logprob at every position, so the positions before the first divergence
(the matched prefix, same context, same token) give that scale in every run with logprobs,
without teacher forcing. A gate with `drift = true` also has the candidate's teacher-forced
logprob of the reference's token up to the flip (strict_gate.judge.drift); the larger figure wins.

The thresholds are orders of magnitude, measured on one machine: a float32 build drifts by
about 3e-5, float16 by about 4e-3, bf16 and 8-bit quantisation by 0.1-0.3 nats. Kernels,
hardware and model depth move these figures; the scale names the order, not the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from strict_gate.runs.records import Record

REDUCTION_ORDER_MAX = 1e-3  # nats: float32 reduction-order noise sits far below (3e-5 measured)
HALF_PRECISION_MAX = 0.05  # nats: float16 rounding sits below (4e-3); bf16 and Q8_0 above (0.2-0.3)


class DriftScale(StrEnum):
    REDUCTION_ORDER = "reduction-order"
    HALF_PRECISION = "half-precision-level"
    QUANTISATION = "quantisation-level"

    @classmethod
    def of(cls, max_abs_dlogprob: float) -> DriftScale:
        if max_abs_dlogprob <= REDUCTION_ORDER_MAX:
            return cls.REDUCTION_ORDER
        if max_abs_dlogprob <= HALF_PRECISION_MAX:
            return cls.HALF_PRECISION
        return cls.QUANTISATION


@dataclass(frozen=True)
class PrefixDrift:
    """The largest |Δ logprob| of the chosen token at the positions both arms shared."""

    max_abs_dlogprob: float
    positions: int  # matched positions it was taken over

    @property
    def scale(self) -> DriftScale:
        return DriftScale.of(self.max_abs_dlogprob)

    def near_tie_label(self) -> str:
        """"near-tie (reduction-order drift 3e-05)" or "near-tie, with quantisation-level drift
        (max |Δlogprob| 0.28 at matched positions)"."""
        x = f"{self.max_abs_dlogprob:.2g}"
        if self.scale == DriftScale.REDUCTION_ORDER:
            return f"near-tie ({self.scale} drift {x})"
        return f"near-tie, with {self.scale} drift (max |Δlogprob| {x} at matched positions)"

    def short(self) -> str:
        """A few words for the console's narrow column."""
        return f"{self.scale.removesuffix('-level')} drift {self.max_abs_dlogprob:.2g}"

    def widened(self, other: float | None) -> PrefixDrift:
        """The same, with another measure of the same positions (the drift pass's): the larger."""
        if other is None or other <= self.max_abs_dlogprob:
            return self
        return PrefixDrift(other, self.positions)

    def to_json(self) -> dict:
        return {"max_abs_dlogprob": self.max_abs_dlogprob, "positions": self.positions, "scale": str(self.scale)}


def prefix_drift(ref: Record, cand: Record, divergence: int) -> PrefixDrift | None:
    """max |lp_R(t) - lp_C(t)| over positions 0..divergence-1, where both chose the same t;
    None without logprobs on either side or without a shared position."""
    if ref.top_logprobs is None or cand.top_logprobs is None or divergence <= 0:
        return None
    diffs = []
    for i in range(divergence):
        t = ref.token_ids[i]
        a, b = ref.logprob_at(i, t), cand.logprob_at(i, t)
        if a is not None and b is not None:
            diffs.append(abs(a - b))
    return PrefixDrift(max(diffs), len(diffs)) if diffs else None
