"""How far two arms already disagreed before they flipped a token: the scale of a near-tie.

A near-tie with |Δ logprob| ~1e-5 at the positions both arms chose alike is a rounding
accident; the same label with drift ~0.3 nats hides that every logprob was
already off, so the "tie" says little about correctness. Both arms report
the chosen token's logprob at every position, so the positions before the first divergence
(the matched prefix, same context, same token) give that scale in every run with logprobs,
without teacher forcing, so the label is the same with and without `drift = true` (whose
teacher-forced figures stay in the drift section).

The scale names a magnitude, never a cause: the gate cannot know why two arms drift (a
bf16 build can drift like an 8-bit one, an int8 one like float16), so the labels say how
large the drift is against two yardsticks measured on one machine: float32 rounding (a
float32 build drifts by about 3e-5) and half precision (float16 by about 4e-3; bf16 and
8-bit builds by 0.1-0.3 nats). Kernels, hardware and model depth move these figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from strict_gate.runs.records import Record

FLOAT32_ROUNDING_MAX = 1e-3  # nats: float32 rounding noise sits far below (3e-5 measured)
HALF_PRECISION_MAX = 0.05  # nats: float16 rounding sits below (4e-3); bf16 and Q8_0 above (0.2-0.3)


class DriftScale(StrEnum):
    """A magnitude band of |Δ logprob|; the value is how report.json spells it."""

    FLOAT32_ROUNDING = "float32-rounding-level"
    HALF_PRECISION = "half-precision-level"
    BEYOND_HALF_PRECISION = "beyond-half-precision"

    @classmethod
    def of(cls, max_abs_dlogprob: float) -> DriftScale:
        if max_abs_dlogprob <= FLOAT32_ROUNDING_MAX:
            return cls.FLOAT32_ROUNDING
        if max_abs_dlogprob <= HALF_PRECISION_MAX:
            return cls.HALF_PRECISION
        return cls.BEYOND_HALF_PRECISION

    @property
    def words(self) -> str:
        """"at float32 rounding level", "at half-precision level", "beyond half precision"."""
        return {DriftScale.FLOAT32_ROUNDING: "at float32 rounding level",
                DriftScale.HALF_PRECISION: "at half-precision level",
                DriftScale.BEYOND_HALF_PRECISION: "beyond half precision"}[self]


@dataclass(frozen=True)
class PrefixDrift:
    """The largest |Δ logprob| of the chosen token at the positions both arms shared."""

    max_abs_dlogprob: float
    positions: int  # matched positions it was taken over

    @property
    def scale(self) -> DriftScale:
        return DriftScale.of(self.max_abs_dlogprob)

    def near_tie_label(self) -> str:
        """"near-tie (drift 3e-05 at matched positions: at float32 rounding level)": the same
        words at every scale, a magnitude and no cause."""
        return f"near-tie (drift {self.max_abs_dlogprob:.2g} at matched positions: {self.scale.words})"

    def short(self) -> str:
        """A few words for the console's narrow column."""
        return f"drift {self.max_abs_dlogprob:.2g} {self.scale.words}"

    def to_json(self) -> dict:
        return {"max_abs_dlogprob": self.max_abs_dlogprob, "positions": self.positions, "scale": str(self.scale)}


def prefix_drift(ref: Record, cand: Record, divergence: int) -> PrefixDrift | None:
    """max |lp_R(t) - lp_C(t)| over positions 0..divergence-1, where both chose the same t;
    None without logprobs on either side or without a shared position."""
    if ref.top_logprobs is None or cand.top_logprobs is None or divergence <= 0:
        return None
    tokens = ref.token_ids[:divergence]  # logprobs_at: one pass over a run's arrays where it has them
    diffs = [abs(a - b) for a, b in zip(ref.logprobs_at(tokens), cand.logprobs_at(tokens))
             if a is not None and b is not None]
    return PrefixDrift(max(diffs), len(diffs)) if diffs else None

