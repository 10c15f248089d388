"""Drift before a flip: the reference's tokens teacher-forced through the candidate.

Token equality says nothing until a token flips. Scoring every reference position with the
candidate, on the reference's own prefix, shows how far the two distributions have moved
apart while the tokens still agree, and how close the reference's top-2 margins come to a
flip. The reference side's figures come from its record (its logprob of its own token, its
top-k, its top-2 margin); the candidate side from `Engine.score(prompt, reference tokens, k)`.

KL estimator (named in report.json as KL_ESTIMATOR): per position, over U = the union of both
top-k lists plus one bucket for the rest of the vocabulary. A token missing from one side's
list gets that side's k-th logprob (an upper bound on its true probability). Each side's rest
bucket is 1 - its mass on U (at least REST_FLOOR); a side whose filled mass on U exceeds 1 is
renormalised. Both sides are then distributions on U + rest, so KL(ref || cand) >= 0. Bias:
grouping the tail into one bucket can only lower a KL (data-processing inequality), and the
filled tokens shrink the apparent difference on those tokens, so the estimate underestimates
the true KL, mostly through the tail. See docs/drift.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from strict_gate.core.sections import Informational, read_section
from strict_gate.errors import InputError
from strict_gate.judge.compare import BAND_EPS
from strict_gate.judge.schema import DriftDoc, PromptDriftDoc, StatsDoc
from strict_gate.runs.records import Record, ScoredStep, TopK

KL_ESTIMATOR = (
    "topk-union+rest: KL(ref||cand) over the union of both top-k lists plus one rest-of-vocabulary "
    "bucket; a token missing from one side at that side's k-th logprob; renormalised only where the "
    "filled mass exceeds 1; underestimates the tail"
)
REST_FLOOR = 1e-10  # the rest bucket never reaches 0, so KL stays finite

Scorer = Callable[[Record], Sequence[ScoredStep]]


@dataclass(frozen=True)
class Stats:
    """mean, p99 (linear interpolation) and max of a set of per-position figures."""

    mean: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, xs: np.ndarray) -> Stats:
        if xs.size == 0:
            return cls(None, None, None)
        return cls(float(xs.mean()), float(np.percentile(xs, 99)), float(xs.max()))

    def to_json(self) -> dict:
        return {"mean": self.mean, "p99": self.p99, "max": self.max}

    @classmethod
    def from_doc(cls, d: StatsDoc | None) -> Stats:
        return cls(None, None, None) if d is None else cls(d.mean, d.p99, d.max)


@dataclass(frozen=True)
class PositionDrift:
    """Per-position figures of one prompt, as numpy arrays (not written to JSON)."""

    same_top1: np.ndarray  # bool: the candidate's argmax is the reference's token
    abs_dlogprob: np.ndarray  # |lp_ref(r) - lp_cand(r)|, NaN where the candidate gave no logprob of r
    kl: np.ndarray
    margin: np.ndarray  # the reference's top-1 minus top-2 logprob


@dataclass(frozen=True)
class PromptDrift:
    """One prompt's drift, or why it is missing (`error`; then every figure is None)."""

    id: str
    positions: int = 0
    same_top1: int = 0
    abs_dlogprob: Stats = Stats(None, None, None)
    kl: Stats = Stats(None, None, None)
    min_reference_margin: float | None = None
    positions_within_band: int = 0
    first_top1_difference: int | None = None  # the first position where the candidate would pick another token
    error: str | None = None
    steps: PositionDrift | None = field(default=None, compare=False, repr=False)
    drift_before_divergence: float | None = None  # max |Δ logprob| at positions 0..d of a divergent prompt

    @property
    def same_top1_rate(self) -> float | None:
        return self.same_top1 / self.positions if self.positions else None

    def to_json(self) -> dict:
        if self.error is not None:
            return {"id": self.id, "error": self.error}
        out = {
            "id": self.id,
            "positions": self.positions,
            "same_top1": self.same_top1,
            "same_top1_rate": self.same_top1_rate,
            "first_top1_difference": self.first_top1_difference,
            "abs_dlogprob": self.abs_dlogprob.to_json(),
            "kl": self.kl.to_json(),
            "min_reference_margin": self.min_reference_margin,
            "positions_within_band": self.positions_within_band,
        }
        if self.drift_before_divergence is not None:
            out["max_abs_dlogprob_before_divergence"] = self.drift_before_divergence
        return out

    @classmethod
    def from_doc(cls, d: PromptDriftDoc) -> PromptDrift:
        """Back from report.json (no per-position arrays: those are not written)."""
        if d.error is not None:
            return cls(d.id, error=d.error)
        return cls(id=d.id, positions=d.positions, same_top1=d.same_top1, abs_dlogprob=Stats.from_doc(d.abs_dlogprob),
                   kl=Stats.from_doc(d.kl), min_reference_margin=d.min_reference_margin,
                   positions_within_band=d.positions_within_band, first_top1_difference=d.first_top1_difference,
                   drift_before_divergence=d.max_abs_dlogprob_before_divergence)


@dataclass(frozen=True)
class DriftReport(Informational):
    """Totals over every scored position of every scored prompt, and the same per prompt."""

    band: float
    k: int
    positions: int
    same_top1: int
    abs_dlogprob: Stats
    kl: Stats
    min_reference_margin: float | None
    positions_within_band: int
    prompts: dict[str, PromptDrift]
    scored_by: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # {"start": candidate (re)load, "score": the pass}

    @property
    def same_top1_rate(self) -> float | None:
        return self.same_top1 / self.positions if self.positions else None

    @property
    def missing(self) -> dict[str, str]:
        """Prompts without drift figures, and why: never counted as zero drift."""
        return {pid: p.error for pid, p in self.prompts.items() if p.error is not None}

    def with_divergences(self, divergences: Mapping[str, int]) -> DriftReport:
        """Record, per divergent prompt, the largest |Δ logprob| at positions 0..d: the context
        both arms shared up to the flip."""
        prompts = dict(self.prompts)
        for pid, d in divergences.items():
            p = prompts.get(pid)
            if p is None or p.steps is None:
                continue
            window = p.steps.abs_dlogprob[: d + 1]
            window = window[~np.isnan(window)]
            if window.size:
                prompts[pid] = replace(p, drift_before_divergence=float(window.max()))
        return replace(self, prompts=prompts)

    def to_json(self) -> dict:
        return {
            "band": self.band,
            "top_logprobs": self.k,
            "scored_by": self.scored_by,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "prompts_scored": sum(1 for p in self.prompts.values() if p.error is None),
            "prompts_missing": self.missing,
            "positions": self.positions,
            "same_top1": self.same_top1,
            "same_top1_rate": self.same_top1_rate,
            "abs_dlogprob": self.abs_dlogprob.to_json(),
            "kl": {"estimator": KL_ESTIMATOR, **self.kl.to_json()},
            "min_reference_margin": self.min_reference_margin,
            "positions_within_band": self.positions_within_band,
            "prompts": {pid: p.to_json() for pid, p in self.prompts.items()},
        }

    @classmethod
    def from_json(cls, d: dict) -> DriftReport:
        """A stored report's drift, read through its declared shape (judge/schema.py's DriftDoc),
        so `strict-gate diagnose` rewrites the reports without losing it."""
        doc = read_section(d, DriftDoc, "drift")
        if doc.band is None or doc.top_logprobs is None or doc.positions is None or doc.same_top1 is None \
                or doc.positions_within_band is None:
            raise InputError("report.json's drift: band, top_logprobs, positions, same_top1 and "
                             "positions_within_band are required")
        return cls(band=doc.band, k=doc.top_logprobs, positions=doc.positions, same_top1=doc.same_top1,
                   abs_dlogprob=Stats.from_doc(doc.abs_dlogprob), kl=Stats.from_doc(doc.kl),
                   min_reference_margin=doc.min_reference_margin, positions_within_band=doc.positions_within_band,
                   prompts={pid: PromptDrift.from_doc(p) for pid, p in doc.prompts.items()},
                   scored_by=doc.scored_by, seconds=dict(doc.seconds))


def _padded(tops: Sequence[TopK], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids padded with -1, logprobs padded with -inf, each row's k-th (last listed) logprob)."""
    n = len(tops)
    ids = np.full((n, k), -1, dtype=np.int64)
    lps = np.full((n, k), -np.inf)
    kth = np.empty(n)
    for i, top in enumerate(tops):
        row = top[:k]
        ids[i, : len(row)] = [t for t, _ in row]
        lps[i, : len(row)] = [lp for _, lp in row]
        kth[i] = row[-1][1]
    return ids, lps, kth


def _normalised(lps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities on the union columns (-inf -> 0) and the rest bucket, summing to 1 per row."""
    p = np.exp(lps)
    mass = p.sum(axis=1)
    rest = np.maximum(1.0 - mass, REST_FLOOR)
    total = mass + rest
    return p / total[:, None], rest / total


def kl_topk_union(ref_top: Sequence[TopK], cand_top: Sequence[TopK], k: int) -> np.ndarray:
    """KL(ref || cand) per position by the KL_ESTIMATOR rule; >= 0 (clipped at 0 for rounding)."""
    r_ids, r_lps, r_kth = _padded(ref_top, k)
    c_ids, c_lps, c_kth = _padded(cand_top, k)
    eq = (r_ids[:, :, None] == c_ids[:, None, :]) & (r_ids[:, :, None] >= 0)
    # the reference's listed tokens: the candidate's logprob where it lists them, else its k-th
    q_on_r = np.where(eq.any(axis=2), np.where(eq, c_lps[:, None, :], -np.inf).max(axis=2), c_kth[:, None])
    q_on_r = np.where(r_ids >= 0, q_on_r, -np.inf)
    # the candidate's tokens the reference does not list: the reference's k-th logprob
    extra = (c_ids >= 0) & ~eq.any(axis=1)
    p_lps = np.concatenate([r_lps, np.where(extra, r_kth[:, None], -np.inf)], axis=1)
    q_lps = np.concatenate([q_on_r, np.where(extra, c_lps, -np.inf)], axis=1)
    p, p_rest = _normalised(p_lps)
    q, q_rest = _normalised(q_lps)
    listed = p > 0
    terms = np.where(listed, p * (np.log(np.where(listed, p, 1.0)) - np.log(np.where(listed, q, 1.0))), 0.0)
    kl = terms.sum(axis=1) + p_rest * (np.log(p_rest) - np.log(q_rest))
    return np.maximum(kl, 0.0)


def prompt_drift(ref: Record, scored: Sequence[ScoredStep], k: int, band: float) -> PromptDrift:
    """One prompt's figures from the reference record and the candidate's teacher-forced steps."""
    tokens = ref.token_ids
    if ref.top_logprobs is None or len(ref.top_logprobs) != len(tokens):
        return PromptDrift(ref.id, error="the reference record has no top-k logprobs for every token")
    if len(scored) != len(tokens):
        return PromptDrift(ref.id, error=f"the candidate scored {len(scored)} of {len(tokens)} reference tokens")
    if any(not s.top for s in scored):
        return PromptDrift(ref.id, error="the candidate's scoring gave a position without a top-k")
    n = len(tokens)
    if n == 0:
        return PromptDrift(ref.id)
    ref_top = [ref.top_logprobs[i] for i in range(n)]
    cand_top = [s.top for s in scored]
    same = np.array([s.argmax == t for s, t in zip(scored, tokens)], dtype=bool)
    lp_r = np.array([ref.logprob_at(i, t) for i, t in enumerate(tokens)], dtype=float)
    lp_c = np.array(
        [s.logprob if s.logprob is not None else next((lp for t, lp in s.top if t == s.token_id), np.nan)
         for s in scored],
        dtype=float,
    )
    dlp = np.abs(lp_r - lp_c)
    margin = np.array([top[0][1] - top[1][1] if len(top) > 1 else np.nan for top in ref_top])
    kl = kl_topk_union(ref_top, cand_top, k)
    steps = PositionDrift(same, dlp, kl, margin)
    return _summarise(ref.id, steps, band)


def _summarise(pid: str, s: PositionDrift, band: float) -> PromptDrift:
    margins = s.margin[~np.isnan(s.margin)]
    differ = np.flatnonzero(~s.same_top1)
    return PromptDrift(
        id=pid,
        positions=len(s.same_top1),
        same_top1=int(s.same_top1.sum()),
        abs_dlogprob=Stats.of(s.abs_dlogprob[~np.isnan(s.abs_dlogprob)]),
        kl=Stats.of(s.kl),
        min_reference_margin=float(margins.min()) if margins.size else None,
        positions_within_band=int((margins <= band + BAND_EPS).sum()),
        first_top1_difference=int(differ[0]) if differ.size else None,
        steps=s,
    )


def measure_drift(
    reference: Mapping[str, Record], prompt_ids: Sequence[str], score: Scorer, *, k: int, band: float,
    scored_by: str | None = None,
) -> DriftReport:
    """Score every prompt's reference tokens with `score` and total the figures. A prompt the
    reference has no tokens for, or whose scoring fails, is listed as missing with the reason."""
    prompts: dict[str, PromptDrift] = {}
    for pid in prompt_ids:
        ref = reference.get(pid)
        if ref is None or ref.error is not None:
            prompts[pid] = PromptDrift(pid, error="no reference tokens (the reference record is missing or failed)")
            continue
        try:
            steps = score(ref)
        except Exception as e:  # any engine failure: this prompt has no drift, and the report says so
            prompts[pid] = PromptDrift(pid, error=f"candidate scoring failed: {type(e).__name__}: {e}")
            continue
        prompts[pid] = prompt_drift(ref, steps, k, band)
    return total(prompts, k=k, band=band, scored_by=scored_by)


def total(prompts: dict[str, PromptDrift], *, k: int, band: float, scored_by: str | None = None) -> DriftReport:
    """The totals over every position of every prompt that has figures."""
    parts = [p.steps for p in prompts.values() if p.error is None and p.steps is not None]
    cat = PositionDrift(*(np.concatenate([getattr(s, f) for s in parts]) if parts else np.array([])
                          for f in ("same_top1", "abs_dlogprob", "kl", "margin")))
    whole = _summarise("", cat, band) if parts else PromptDrift("")
    return DriftReport(
        band=band, k=k, positions=whole.positions, same_top1=whole.same_top1, abs_dlogprob=whole.abs_dlogprob,
        kl=whole.kl, min_reference_margin=whole.min_reference_margin,
        positions_within_band=whole.positions_within_band, prompts=prompts, scored_by=scored_by,
    )
