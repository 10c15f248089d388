"""The comparator: per-prompt agreement between a reference run R and a candidate run C.

Pure Python over stored runs (no torch): the same code judges a live gate and two run
directories from last night. A divergence is a near-tie only when BOTH sides' logprobs
say the two tokens are within the band; missing logprobs never make a near-tie.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from strict_gate.core.fmt import fmt_vs
from strict_gate.judge.prefix_drift import PrefixDrift, prefix_drift
from strict_gate.judge.text_only import TEXT_ONLY, Decode, prompt_problem, text_level
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE, greedy_violation
from strict_gate.runs.records import Record, TopK


class Status(StrEnum):
    """A prompt's outcome; the value is how reports spell it."""

    MATCH = "match"
    NEAR_TIE = "near_tie"
    DIVERGENT = "divergent"
    LENGTH_MISMATCH = "length_mismatch"
    TOKENIZATION_MISMATCH = "tokenization_mismatch"
    NOT_GREEDY = "not_greedy"
    MISSING = "missing"
    ERROR = "error"


STATUSES = tuple(Status)
UNCOMPARED = (Status.MISSING, Status.ERROR)
DEFAULT_BAND = 0.5
BAND_EPS = 1e-9  # a gap equal to the band up to float representation is within it
TEXT_LEVEL = "text-level: the text-only server's text equals the reference's (no logprobs compared)"


def check_band(band: float) -> float:
    """The near-tie band must be a finite number >= 0 (nats)."""
    if not isinstance(band, (int, float)) or isinstance(band, bool) or not math.isfinite(band) or band < 0:
        raise ValueError(f"band must be a finite number >= 0 (nats), got {band!r}")
    return float(band)


MEASURED = "measured"  # band = "measured": the band from the reference's noise profile (docs/noise.md)


def check_gate_band(value: object) -> float | str:
    """A gate's band: a number of nats >= 0, or "measured" (from its noise profile)."""
    if value == MEASURED:
        return MEASURED
    if isinstance(value, str):
        raise ValueError(f'band = {value!r}: give a number of nats >= 0 or "measured"')
    return check_band(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Rescored:
    """One side's teacher-forced gap at a divergence (on the common prefix), or why there is none.
    `refutes`: the side was re-scored and the other token fell outside its top-k, which is a real
    divergence, not a missing figure."""

    gap: float | None
    why: str | None = None
    refutes: bool = False

    def to_json(self) -> dict:
        return {"gap": self.gap, "why": self.why, "refutes": self.refutes}


@dataclass(frozen=True)
class Divergence:
    """The first position where the two sequences differ."""

    position: int
    reference_token: int | None  # None: the reference ended here (length mismatch)
    candidate_token: int | None
    reference_gap: float | None  # lp_R(r) - lp_R(c), None when c is outside R's top-k
    candidate_gap: float | None  # lp_C(c) - lp_C(r), None when r is outside C's top-k
    reference_margin: float | None  # R's top-1 minus top-2 logprob at this step
    reason: str  # why it is (or is not) a near-tie, in words
    reference_top: TopK | None = None
    candidate_top: TopK | None = None
    reference_rescored: Rescored | None = None  # the teacher-forced gap, when the divergence was re-scored
    candidate_rescored: Rescored | None = None
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE  # the arm's greedy check: how a negative gap is worded


@dataclass(frozen=True)
class PromptComparison:
    id: str
    status: Status
    first_divergence: Divergence | None
    matched_positions: int  # positionwise matches over the common length
    prefix_length: int  # tokens equal before the first divergence
    reference_length: int
    candidate_length: int
    detail: str = ""  # for missing / error / tokenization_mismatch
    prefix_drift: PrefixDrift | None = None  # |Δ logprob| at the positions before the first divergence

    @property
    def positions(self) -> int:
        """Positions this prompt is scored over: the longer of the two sequences."""
        return max(self.reference_length, self.candidate_length)


@dataclass(frozen=True)
class Summary:
    prompts_total: int
    prompts_exact: int
    positions_total: int
    positions_matched: int
    prefix_positions: int
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "prompts_total": self.prompts_total,
            "prompts_exact": self.prompts_exact,
            "positions_total": self.positions_total,
            "positions_matched": self.positions_matched,
            "prefix_positions": self.prefix_positions,
            "counts": dict(self.counts),
        }


@dataclass(frozen=True)
class Comparison:
    band: float
    prompts: tuple[PromptComparison, ...]
    summary: Summary


def _lp(top: TopK | None, token: int) -> float | None:
    if top is None:
        return None
    for t, lp in top:
        if t == token:
            return lp
    return None


def _margin(top: TopK | None) -> float | None:
    if top is None or len(top) < 2:
        return None
    return top[0][1] - top[1][1]


def _step(rec: Record, i: int) -> TopK | None:
    if rec.top_logprobs is None or i >= len(rec.top_logprobs):
        return None
    return rec.top_logprobs[i]


def _unknown(label: str, gap: float | None, top: TopK | None, other: str) -> str | None:
    """Why one side's decode-time gap is not known, or None when it is."""
    if top is None:
        return f"the {label} run has no logprobs at this step"
    if gap is None:
        return f"the {other} token is outside the {label}'s top-{len(top)}"
    return None


def _value_problem(label: str, gap: float, band: float, tolerance: float) -> str | None:
    """Why a known gap does not make a near-tie, or None when 0 <= gap <= band. A negative one
    means the side's own logits rank the other token first: they did not flip, so it is no
    near-tie; within the greedy tolerance its decode was still greedy, and the words say so."""
    if not math.isfinite(gap):
        return f"{label} {gap} is not a finite number"
    if gap < 0:
        side = label.split()[0]
        if gap >= -tolerance - BAND_EPS:
            return (f"{label} {gap:.6g} < 0: the {side}'s own logprobs rank the other token {-gap:.4g} nats higher, "
                    f"within the greedy tolerance {tolerance:g} (its choice passes as greedy), so its logits did not "
                    "flip: no near-tie")
        return (f"{label} {gap:.6g} < 0, beyond the greedy tolerance {tolerance:g}: the {side}'s own logprobs rank "
                "the other token higher, so its choice was not its own argmax")
    if gap > band + BAND_EPS:
        g, b = fmt_vs(gap, band)
        return f"{label} {g} > band {b}"
    return None


def side_problem(label: str, gap: float | None, top: TopK | None, other: str, band: float,
                 rescored: Rescored | None = None, tolerance: float = DEFAULT_GREEDY_TOLERANCE) -> str | None:
    """Why one side does not make a near-tie, or None when it does: every known measure of its
    gap lies in [0, band] (decode-time, from its top-k; teacher-forced, re-scored, by its size:
    a side's prefill may rank a tie the other way round than its decode did, a rounding, not a
    greedy violation), at least one is known, and re-scoring did not put the other token
    outside its top-k. `tolerance` (the greedy tolerance) only words a negative decode gap."""
    unknown = _unknown(label, gap, top, other)
    known = [] if gap is None or unknown is not None else [(f"{label} gap", gap)]
    if rescored is not None and rescored.gap is not None:  # its size: prefill may order a tie either way
        known.append((f"{label} re-scored |gap|", abs(rescored.gap)))
    if not known and rescored is not None and rescored.why == TEXT_ONLY:
        return f"{label} gap unknown: {TEXT_ONLY}"
    problems = [p for lab, g in known if (p := _value_problem(lab, g, band, tolerance)) is not None]
    if rescored is not None and rescored.refutes:
        problems.append(str(rescored.why))
    if problems:
        return "; ".join(problems)
    if known:
        return None
    why = f", and {rescored.why}" if rescored is not None and rescored.why else ""
    return f"{label} gap unknown: {unknown}{why}"


def problems(d: Divergence, band: float) -> list[tuple[str, str]]:
    """(side, why) for each side that does not make the divergence a near-tie."""
    tol = d.greedy_tolerance
    found = (
        ("reference", side_problem("reference", d.reference_gap, d.reference_top, "candidate's", band,
                                   d.reference_rescored, tol)),
        ("candidate", side_problem("candidate", d.candidate_gap, d.candidate_top, "reference's", band,
                                   d.candidate_rescored, tol)),
    )
    return [(side, why) for side, why in found if why is not None]


def classify(d: Divergence, band: float) -> tuple[Status, str]:
    """The one classification of a divergence, from both sides and every gap known of each:
    near_tie iff neither side has a problem; otherwise divergent, with every reason."""
    reasons = [why for _, why in problems(d, band)]
    if reasons:
        return Status.DIVERGENT, "; ".join(reasons)
    return Status.NEAR_TIE, tie_reason(d, band)


def tie_reason(d: Divergence, band: float) -> str:
    """A near-tie's reason. A negative re-scored gap is within the band by its size only, and is
    named for what it is: that side's prefill ranks the tie the other way round than its decode
    did. The words never say "[0, band]" of a number outside it."""
    sides = (("reference", d.reference_rescored), ("candidate", d.candidate_rescored))
    rescored = [f"{side} {r.gap:.4g}" for side, r in sides if r is not None and r.gap is not None]
    flipped = [side for side, r in sides if r is not None and r.gap is not None and r.gap < 0]
    if not flipped:
        return f"both gaps within [0, band {band:g}]" + (f" (re-scored: {', '.join(rescored)})" if rescored else "")
    who = " and ".join(f"the {side}'s" for side in flipped)
    return (f"both gaps within the band {band:g} by size (re-scored: {', '.join(rescored)}; negative: "
            f"{who} prefill prefers the other token where its decode chose its own, a prefill/decode "
            "disagreement at a tie)")


def reclassify(pc: PromptComparison, band: float, reference: Rescored | None,
               candidate: Rescored | None) -> PromptComparison:
    """A divergent or near-tie prompt classified again with both sides' re-scored gaps."""
    if pc.first_divergence is None:  # a diverged prompt always has one
        return pc
    d = replace(pc.first_divergence, reference_rescored=reference, candidate_rescored=candidate)
    status, reason = classify(d, band)
    return replace(pc, status=status, first_divergence=replace(d, reason=reason))


def classify_divergence(ref: Record, cand: Record, d: int, band: float,
                        tolerance: float = DEFAULT_GREEDY_TOLERANCE) -> tuple[Status, Divergence]:
    """near_tie iff both decode-time gaps exist, are finite and lie in [0, band]; otherwise
    divergent, with the reason (re-scoring may add the gaps that are missing: reclassify)."""
    r, c = ref.token_ids[d], cand.token_ids[d]
    rtop, ctop = _step(ref, d), _step(cand, d)
    lr_r, lr_c = _lp(rtop, r), _lp(rtop, c)
    lc_c, lc_r = _lp(ctop, c), _lp(ctop, r)
    div = Divergence(
        position=d,
        reference_token=r,
        candidate_token=c,
        reference_gap=lr_r - lr_c if lr_r is not None and lr_c is not None else None,
        candidate_gap=lc_c - lc_r if lc_c is not None and lc_r is not None else None,
        reference_margin=_margin(rtop),
        reason="",
        reference_top=rtop,
        candidate_top=ctop,
        candidate_rescored=Rescored(None, TEXT_ONLY) if cand.text_only is not None else None,
        greedy_tolerance=tolerance,
    )
    status, reason = classify(div, band)
    return status, replace(div, reason=reason)


def _not_greedy(pid: str, ref: Record, cand: Record, tolerance: float, rlen: int, clen: int) -> PromptComparison | None:
    for label, rec in (("candidate", cand), ("reference", ref)):
        v = greedy_violation(rec, tolerance)
        if v is not None:
            g, t = fmt_vs(v.gap, tolerance)
            detail = (
                f"the {label} chose token {v.chosen} at position {v.position}, {g} nats below its own top-1 "
                f"{v.top1} (greedy tolerance {t}): not greedy decoding"
            )
            div = Divergence(
                position=v.position,
                reference_token=ref.token_ids[v.position] if v.position < len(ref.token_ids) else None,
                candidate_token=cand.token_ids[v.position] if v.position < len(cand.token_ids) else None,
                reference_gap=None,
                candidate_gap=None,
                reference_margin=_margin(_step(ref, v.position)),
                reason=detail,
                reference_top=_step(ref, v.position),
                candidate_top=_step(cand, v.position),
            )
            return PromptComparison(pid, Status.NOT_GREEDY, div, 0, 0, rlen, clen, detail)
    return None


def compare_prompt(
    pid: str,
    ref: Record | None,
    cand: Record | None,
    band: float,
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE,
    decode: Decode | None = None,
) -> PromptComparison:
    """One prompt's outcome. `decode` (a text-only candidate's tokenizer, judge/text_only.py)
    makes equal text a match where the re-tokenized ids differ."""
    rlen = len(ref.token_ids) if ref is not None and ref.error is None else 0
    clen = len(cand.token_ids) if cand is not None and cand.error is None else 0

    def bare(status: Status, detail: str) -> PromptComparison:
        return PromptComparison(pid, status, None, 0, 0, rlen, clen, detail)

    if ref is None or cand is None:
        side = "reference" if ref is None else "candidate"
        if ref is None and cand is None:
            side = "both runs"
        return bare(Status.MISSING, f"no record in the {side}")
    if ref.error is not None or cand.error is not None:
        side, err = ("reference", ref.error) if ref.error is not None else ("candidate", cand.error)
        return bare(Status.ERROR, f"{side} failed: {err}")
    if ref.prompt_token_ids != cand.prompt_token_ids:
        a, b = ref.prompt_token_ids, cand.prompt_token_ids
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return bare(
            Status.TOKENIZATION_MISMATCH,
            f"prompt token ids differ at index {k} (reference {len(a)} ids, candidate {len(b)} ids; "
            f"reference {list(a[k:k + 3])} vs candidate {list(b[k:k + 3])})",
        )
    served = next((p for p in (prompt_problem(cand), prompt_problem(ref)) if p is not None), None)
    if served is not None:
        return bare(Status.TOKENIZATION_MISMATCH, served)
    bad = _not_greedy(pid, ref, cand, greedy_tolerance, rlen, clen)
    R, C = ref.token_ids, cand.token_ids
    common = min(len(R), len(C))
    matched = sum(1 for i in range(common) if R[i] == C[i])
    if bad is not None:
        prefix = next((i for i in range(common) if R[i] != C[i]), common)
        return replace(bad, matched_positions=matched, prefix_length=prefix)
    d = next((i for i in range(common) if R[i] != C[i]), None)
    if cand.text_only is not None and (text_level(ref, cand, decode) or (d is None and len(R) == len(C))):
        return PromptComparison(pid, Status.MATCH, None, matched, common, rlen, clen, detail=TEXT_LEVEL)
    if d is None:
        if len(R) == len(C):
            return PromptComparison(pid, Status.MATCH, None, matched, common, rlen, clen)
        shorter = "candidate" if len(C) < len(R) else "reference"
        div = Divergence(
            position=common,
            reference_token=R[common] if len(R) > common else None,
            candidate_token=C[common] if len(C) > common else None,
            reference_gap=None,
            candidate_gap=None,
            reference_margin=_margin(_step(ref, common)),
            reason=_stopped(shorter, common, ref, cand),
            reference_top=_step(ref, common),
            candidate_top=_step(cand, common),
        )
        return PromptComparison(pid, Status.LENGTH_MISMATCH, div, matched, common, rlen, clen,
                                prefix_drift=prefix_drift(ref, cand, common))
    status, div = classify_divergence(ref, cand, d, band, greedy_tolerance)
    return PromptComparison(pid, status, div, matched, d, rlen, clen, prefix_drift=prefix_drift(ref, cand, d))


def _stopped(shorter: str, common: int, ref: Record, cand: Record) -> str:
    """Why one side has fewer tokens; a text-only server that states more tokens than its text
    holds (usage.completion_tokens) is said to, not said to have stopped."""
    finish = f"(finish_reason {ref.finish_reason!r} vs {cand.finish_reason!r})"
    told = cand.text_only.usage_completion_tokens if cand.text_only is not None else None
    if shorter == "candidate" and told is not None and told > common:
        return (f"the candidate's text holds {common} tokens, its server says it generated {told} "
                f"(usage.completion_tokens): the last {told - common} cannot be seen in its text, so they are "
                f"unverified {finish}")
    return f"the {shorter} stopped after {common} tokens {finish}"


def with_prompts(comparison: Comparison, prompts: Iterable[PromptComparison]) -> Comparison:
    """The same comparison with some prompts classified again, and its summary recounted."""
    by_id = {p.id: p for p in prompts}
    kept = tuple(by_id.get(p.id, p) for p in comparison.prompts)
    return replace(comparison, prompts=kept, summary=summarize(kept))


def summarize(prompts: Iterable[PromptComparison]) -> Summary:
    prompts = list(prompts)
    counts = Counter(p.status for p in prompts)
    return Summary(
        prompts_total=len(prompts),
        prompts_exact=counts.get(Status.MATCH, 0),
        positions_total=sum(p.positions for p in prompts),
        positions_matched=sum(p.matched_positions for p in prompts),
        prefix_positions=sum(p.prefix_length for p in prompts),
        counts={str(s): counts.get(s, 0) for s in STATUSES},
    )
