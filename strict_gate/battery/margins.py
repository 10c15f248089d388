"""Margin profiles and the flip model a battery is chosen by.

The model (docs/battery.md): a small change to the engine adds to every logit an independent
Gaussian error of standard deviation `sigma` nats. Log-softmax keeps logit differences, so at a
step whose top-1 leads alternative j by gap g_j the pair swaps with probability
Phi(-g_j / (sigma * sqrt 2)) = erfc(g_j / (2 sigma)) / 2, and the step flips with
p_step = 1 - prod_j (1 - that), over the alternatives the reference reported (its top-K).
The prompt flips when any step does: until the first flip the continuation is the
reference's, so its steps are exactly the ones seen, and P = 1 - prod_steps (1 - p_step).
Steps are taken as independent; that is the model's simplification, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strict_gate.errors import InputError
from strict_gate.runs.records import Record

_ERFC = np.frompyfunc(math.erfc, 1, 1)


@dataclass(frozen=True)
class MarginProfile:
    """One prompt's reference margins: top-1 minus top-2 per step, and every alternative's gap."""

    id: str
    margins: tuple[float, ...]  # per step, top-1 minus top-2 logprob (nats)
    gaps: tuple[tuple[float, ...], ...]  # per step, top-1 minus each reported alternative

    @property
    def steps(self) -> int:
        return len(self.margins)

    @property
    def smallest(self) -> float:
        return min(self.margins) if self.margins else math.inf

    def within(self, band: float) -> int:
        return sum(1 for m in self.margins if m <= band)

    def first_within(self, band: float) -> int | None:
        return next((i for i, m in enumerate(self.margins) if m <= band), None)

    def flip_probability(self, sigma: float) -> float:
        return float(prompt_flip_probabilities([self], sigma)[0])

    def to_json(self, band: float) -> dict:
        return {
            "steps": self.steps,
            "smallest_margin": self.smallest if self.margins else None,
            "within_band": self.within(band),
            "first_within_band": self.first_within(band),
            "margins": [round(m, 6) for m in self.margins],
        }


def profile(rec: Record) -> MarginProfile:
    """The profile of one reference record; a record without top-2 at some step is refused:
    a margin the reference did not report cannot be assumed."""
    if rec.error is not None:
        raise InputError(f"prompt {rec.id!r}: the reference failed on it ({rec.error}); no margins")
    if rec.top_logprobs is None:
        raise InputError(f"prompt {rec.id!r}: the reference run has no top logprobs; build with --top-logprobs >= 2")
    margins, gaps = [], []
    for i, top in enumerate(rec.top_logprobs):
        if len(top) < 2:
            raise InputError(f"prompt {rec.id!r} step {i}: fewer than 2 top logprobs; need --top-logprobs >= 2")
        lp1 = top[0][1]
        g = tuple(lp1 - lp for _, lp in top[1:])
        margins.append(g[0])
        gaps.append(g)
    return MarginProfile(rec.id, tuple(margins), tuple(gaps))


def _flat(profiles: Sequence[MarginProfile]) -> tuple[np.ndarray, np.ndarray]:
    """Every gap of every prompt in one array, with the index of the prompt it belongs to."""
    gaps = [g for prof in profiles for step in prof.gaps for g in step]
    owner = [i for i, prof in enumerate(profiles) for step in prof.gaps for _ in step]
    return np.maximum(np.array(gaps, dtype=float), 0.0), np.array(owner, dtype=np.int64)


def _probabilities(gaps: np.ndarray, owner: np.ndarray, n: int, sigma: float) -> np.ndarray:
    if not sigma > 0 or not math.isfinite(sigma):
        raise InputError(f"perturbation scale {sigma!r}: must be a finite number > 0 (nats)")
    swap = np.asarray(_ERFC(gaps / (2.0 * sigma)), dtype=float) * 0.5
    log_keep = np.bincount(owner, weights=np.log1p(-np.minimum(swap, 1 - 1e-16)), minlength=n)
    return np.maximum(-np.expm1(log_keep), 0.0)  # never -0.0


def prompt_flip_probabilities(profiles: Sequence[MarginProfile], sigma: float) -> np.ndarray:
    """P(flip) of each prompt under logit noise of `sigma` nats (the model above)."""
    return _probabilities(*_flat(profiles), len(profiles), sigma)


def battery_detection(p: np.ndarray) -> float:
    """P(at least one prompt flips), prompts independent."""
    return max(0.0, -math.expm1(float(np.log1p(-np.minimum(p, 1 - 1e-16)).sum()))) if p.size else 0.0


def calibrate(profiles: Sequence[MarginProfile], target: float = 0.01) -> float:
    """The sigma at which the pool's mean prompt flip probability is `target`: the scale of a
    change that flips about one prompt in a hundred (bisection in log sigma)."""
    if not 0 < target < 1:
        raise InputError(f"calibration target {target!r}: must lie strictly between 0 and 1")
    gaps, owner = _flat(profiles)
    lo, hi = 1e-9, 1e3
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if _probabilities(gaps, owner, len(profiles), mid).mean() < target:
            lo = mid
        else:
            hi = mid
    return float(f"{math.sqrt(lo * hi):.4g}")
