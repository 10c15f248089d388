"""Every token after a flip, judged on the candidate's own prefix (the every-token rule).

After the first divergence the two continuations are no longer aligned, so the candidate's
later tokens cannot be compared with the reference's. Each later candidate token t at
position j is judged by teacher forcing instead: the reference scores the candidate's prompt +
tokens[:j] (diagnose.py's re-scoring), and the candidate's own view of that prefix (its decode
top-k, and its scoring of its own tokens where it can score) gives the other side. A later
position is

  follows     t is the reference's argmax on that prefix
  near-tie    both sides' gaps within the band, by the same two-sided rule as the first
              divergence (judge/compare.py's classify)
  divergent   beyond the band, t outside what the reference scored, or a side's gap unknown
  unverified  the reference did not score it (no re-scoring, a failed one, fewer steps)

A near-tie prompt passes only when every later position follows or is a near-tie; one with
an unverified position is `unverified` (never a pass). judge_later is the whole rule: a
text-only arm with the reference's gaps alone calls it with one_sided=True.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from strict_gate.judge.compare import Divergence, PromptComparison, Rescored, Status, classify, side_problem
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE
from strict_gate.runs.records import ScoredStep, TopK

NAMED_POSITIONS = 20  # later near-ties and divergences kept per prompt (the counts are whole)


class Later(StrEnum):
    """One later position's judgement, and a prompt's (the worst of its positions)."""

    FOLLOWS = "follows"
    NEAR_TIE = "near_tie"
    DIVERGENT = "divergent"
    UNVERIFIED = "unverified"


@dataclass(frozen=True)
class ScoredPosition:
    """The reference's teacher-forced view of one candidate token on the candidate's prefix."""

    position: int
    token: int
    gap: float | None  # lp_R(argmax) - lp_R(token) >= 0; None: the token is outside the reference's top-k
    reference_argmax: int


@dataclass(frozen=True)
class CandidateView:
    """The candidate's own view of its continuation: its decode top-k by position (its record)
    and its teacher-forced scoring of its own tokens (`scored`, from position 0), or why none."""

    decode: Sequence[TopK | None] = ()
    scored: Sequence[ScoredStep] | None = None
    why: str | None = None  # why `scored` is None


@dataclass(frozen=True)
class LaterPosition:
    """A later position that did not simply follow: a further near-tie or a divergence."""

    position: int
    token: int  # the candidate's token
    reference_argmax: int
    reference_gap: float | None  # re-scored, on the candidate's prefix
    candidate_gap: float | None  # lp_C(t) - lp_C(argmax_R), from its decode top-k
    candidate_rescored: float | None  # the same from its scoring of its own tokens; < 0: prefill/decode disagree
    kind: Later
    reason: str

    def to_json(self) -> dict:
        return {"position": self.position, "token": self.token, "reference_argmax": self.reference_argmax,
                "reference_gap": self.reference_gap, "candidate_gap": self.candidate_gap,
                "candidate_rescored": self.candidate_rescored, "kind": str(self.kind), "reason": self.reason}

@dataclass(frozen=True)
class Cascade:
    """Every candidate position after the first divergence `first`, judged. Positions
    [unverified_from, end) could not be judged, because of `why`."""

    first: int
    end: int  # the candidate's length: later positions are first+1 .. end-1
    judged: int = 0  # later positions judged (follows + near-ties + divergent)
    flips: tuple[LaterPosition, ...] = ()  # later near-ties (the first NAMED_POSITIONS)
    flip_count: int = 0
    divergent: tuple[LaterPosition, ...] = ()  # the first NAMED_POSITIONS
    divergent_count: int = 0
    worst_gap: float | None = None  # the largest reference gap at a later position (None: none known)
    unverified_from: int | None = None
    why: str | None = None  # why positions went unjudged
    candidate_note: str | None = None  # what is unknown of the candidate's side, and why
    one_sided: bool = False  # judged on the reference's gaps alone
    prefill_decode: tuple[int, ...] = field(default=())  # later positions where the candidate's prefill and decode disagree

    @property
    def later(self) -> int:
        return max(0, self.end - self.first - 1)

    @property
    def outcome(self) -> Later:
        if self.divergent_count:
            return Later.DIVERGENT
        if self.unverified_from is not None:
            return Later.UNVERIFIED
        return Later.NEAR_TIE if self.flip_count else Later.FOLLOWS

    @property
    def unverified(self) -> str | None:
        """Which later positions are unjudged and why, in words; None when every one was judged."""
        if self.unverified_from is None:
            return None
        a, b = self.unverified_from, self.end - 1
        span = f"position {a}" if a == b else f"positions {a}-{b}"
        return f"{span} after the flip not judged: {self.why}"

    def counts(self) -> str:
        """Judged, flips, divergences and the worst gap, in a few words."""
        worst = "" if self.worst_gap is None else f", worst later gap {self.worst_gap:.4g}"
        div = f", {self.divergent_count} later divergent" if self.divergent_count else ""
        return f"{self.judged}/{self.later} later position(s) judged, {self.flip_count} later flip(s){div}{worst}"

    def summary(self) -> str:
        """One line for a report: judged, flips, worst gap, the first later divergence or what is unjudged."""
        head = self.counts()
        if self.divergent:
            d = self.divergent[0]
            head += (f"; first later divergence at {d.position}: token {d.token} vs the reference's argmax "
                     f"{d.reference_argmax} ({d.reason})")
        if self.unverified is not None:
            head += f"; {self.unverified}"
        if self.prefill_decode:
            head += (f"; the candidate's prefill and decode disagree at position(s) "
                     f"{', '.join(map(str, self.prefill_decode[:10]))}")
        if self.candidate_note:
            head += f"; {self.candidate_note}"
        return head

    def to_json(self) -> dict:
        return {"first": self.first, "end": self.end, "outcome": str(self.outcome), "later": self.later,
                "judged": self.judged, "flips": self.flip_count, "divergent": self.divergent_count,
                "worst_gap": self.worst_gap, "unverified_from": self.unverified_from, "why": self.why,
                "candidate_note": self.candidate_note, "one_sided": self.one_sided,
                "prefill_decode": list(self.prefill_decode), "summary": self.summary(),
                "flip_positions": [p.to_json() for p in self.flips],
                "divergent_positions": [p.to_json() for p in self.divergent]}

def stop_problem(tokens: Sequence[int], finish: str | None, max_tokens: int, eos: frozenset[int] | None, *,
                 who: str = "the candidate", other: str = "the reference") -> str | None:
    """Why a candidate's stop after a flip is not judged, or None: it ran to max_tokens, or it
    ended on an id known to end a sequence (that token's own judgement is the stop's). Any other
    early stop leaves unjudged the positions the reference may have gone on to. Every arm that
    judges what follows a flip asks here (the gate, an invariance variant against its batch-1
    run: `who` and `other` name the two sides)."""
    n = len(tokens)
    if finish != "stop" or not tokens or n >= max_tokens or (eos is not None and tokens[-1] in eos):
        return None
    span = f"position {n}" if n == max_tokens - 1 else f"positions {n}-{max_tokens - 1}"
    what = (f"which is not an end-of-sequence id {sorted(eos)}" if eos is not None else
            "and the gate knows no end-of-sequence id (no eos_token_ids, no tokenizer) to tell that it is one")
    return (f'{who} stopped after {n} of {max_tokens} tokens (finish "stop") on token {tokens[-1]}, {what}: '
            f"{span}, where {other} may have gone on, not judged")


def unjudged(first: int, end: int, why: str) -> Cascade:
    """A cascade none of whose later positions could be judged (no re-scoring, a failed one)."""
    return Cascade(first=first, end=end, unverified_from=first + 1 if end > first + 1 else None, why=why)


def _lp(top: TopK | None, token: int) -> float | None:
    return next((v for t, v in top or () if t == token), None)


def _candidate_side(j: int, token: int, argmax: int, cand: CandidateView) -> tuple[float | None, TopK | None, Rescored]:
    """The candidate's decode gap lp_C(t) - lp_C(a) at j, its decode top-k, and its re-scored gap."""
    top = cand.decode[j] if j < len(cand.decode) else None
    lt, la = _lp(top, token), _lp(top, argmax)
    decode = lt - la if lt is not None and la is not None else None
    if cand.scored is None:
        return decode, top, Rescored(None, cand.why or "the candidate did not re-score its tokens")
    if j >= len(cand.scored):
        return decode, top, Rescored(None, f"the candidate scored {len(cand.scored)} of {j + 1} positions")
    s = cand.scored[j]
    st = s.logprob if s.logprob is not None else _lp(s.top, token)
    sa = _lp(s.top, argmax)
    if st is None or sa is None:
        return decode, top, Rescored(None, "the reference's argmax is outside the candidate's top-k on re-scoring",
                                     refutes=True)
    return decode, top, Rescored(st - sa)


def _judge(sp: ScoredPosition, band: float, cand: CandidateView | None, tolerance: float) -> LaterPosition:
    """One later position that is not the reference's argmax: a near-tie or divergent, by classify."""
    ref = (Rescored(sp.gap) if sp.gap is not None
           else Rescored(None, "the candidate's token is outside the reference's top-k on re-scoring", refutes=True))
    if cand is None:  # one-sided: the reference's gap alone
        problem = side_problem("reference", None, None, "candidate's", band, ref)
        kind = Later.DIVERGENT if problem else Later.NEAR_TIE
        return LaterPosition(sp.position, sp.token, sp.reference_argmax, sp.gap, None, None, kind,
                             problem or f"reference gap {sp.gap:.4g} within the band {band:g}")
    decode, top, rescored = _candidate_side(sp.position, sp.token, sp.reference_argmax, cand)
    d = Divergence(position=sp.position, reference_token=sp.reference_argmax, candidate_token=sp.token,
                   reference_gap=None, candidate_gap=decode, reference_margin=None, reason="",
                   reference_top=None, candidate_top=top, reference_rescored=ref, candidate_rescored=rescored,
                   greedy_tolerance=tolerance)
    status, reason = classify(d, band)
    kind = Later.NEAR_TIE if status == Status.NEAR_TIE else Later.DIVERGENT
    return LaterPosition(sp.position, sp.token, sp.reference_argmax, sp.gap, decode, rescored.gap, kind, reason)


def judge_later(first: int, end: int, reference: Sequence[ScoredPosition], band: float, *,
                candidate: CandidateView | None, why_short: str = "the reference scored no further",
                one_sided: bool = False, greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE) -> Cascade:
    """Judge candidate positions first+1 .. end-1 from the reference's re-scored positions
    (`reference`, any order; positions it lacks are unverified because of `why_short`) and the
    candidate's view of its own prefix (ignored when one_sided; the greedy tolerance words a
    negative decode gap)."""
    by_pos = {sp.position: sp for sp in reference}
    flips: list[LaterPosition] = []
    divergent: list[LaterPosition] = []
    worst: float | None = None
    judged, missing = 0, None
    cand = None if one_sided else (candidate or CandidateView(why="no view of the candidate's side"))
    for j in range(first + 1, end):
        sp = by_pos.get(j)
        if sp is None:
            missing = j
            break
        judged += 1
        if sp.gap is not None:
            worst = sp.gap if worst is None else max(worst, sp.gap)
        if sp.token == sp.reference_argmax:
            continue
        lp = _judge(sp, band, cand, greedy_tolerance)
        (flips if lp.kind == Later.NEAR_TIE else divergent).append(lp)
    pd = tuple(p.position for p in (*flips, *divergent) if p.candidate_rescored is not None and p.candidate_rescored < 0)
    note = None
    if cand is not None and cand.scored is None and (flips or divergent):
        note = f"candidate side from its decode top-k only: {cand.why or 'not re-scored'}"
    return Cascade(first=first, end=end, judged=judged, flips=tuple(flips[:NAMED_POSITIONS]), flip_count=len(flips),
                   divergent=tuple(divergent[:NAMED_POSITIONS]), divergent_count=len(divergent), worst_gap=worst,
                   unverified_from=missing, why=why_short if missing is not None else None, candidate_note=note,
                   one_sided=one_sided, prefill_decode=pd)


@dataclass(frozen=True)
class LaterTotals:
    """The every-token judgement over a gate: what the report's figures and the closing line say."""

    flipped: int  # prompts that diverged (near-tie or divergent), a flip at the last position too
    later: int  # candidate positions after those flips
    judged: int
    flips: int  # later near-ties
    divergent: int  # later divergent positions
    prompts_divergent: int  # prompts with a later divergent position
    unverified: int  # later positions not judged
    prompts_unverified: int

    def to_json(self) -> dict:
        return {"prompts_flipped": self.flipped, "later_positions": self.later, "judged": self.judged,
                "later_flips": self.flips, "later_divergent": self.divergent,
                "prompts_divergent_later": self.prompts_divergent, "unverified": self.unverified,
                "prompts_unverified": self.prompts_unverified}

    def line(self) -> str:
        unv = (f", {self.unverified} not judged ({self.prompts_unverified} prompt(s))" if self.unverified else "")
        return (f"after the first divergence: {self.flipped} prompt(s) flipped, {self.judged}/{self.later} later "
                f"position(s) judged, {self.flips} later flip(s), {self.divergent} later divergent position(s) in "
                f"{self.prompts_divergent} prompt(s){unv}")


def later_totals(prompts: Sequence[PromptComparison], later: Mapping[str, Cascade]) -> LaterTotals:
    """Totals over every diverged prompt; one without a cascade counts all its later positions unjudged."""
    rows = []
    for pc in prompts:
        d = pc.first_divergence
        if pc.status not in (Status.NEAR_TIE, Status.DIVERGENT) or d is None:
            continue
        c = later.get(pc.id) or unjudged(d.position, pc.candidate_length, "not re-scored")
        rows.append(c)
    unv = [c.later - c.judged for c in rows]
    return LaterTotals(flipped=len(rows), later=sum(c.later for c in rows),
                       judged=sum(c.judged for c in rows), flips=sum(c.flip_count for c in rows),
                       divergent=sum(c.divergent_count for c in rows),
                       prompts_divergent=sum(1 for c in rows if c.divergent_count), unverified=sum(unv),
                       prompts_unverified=sum(1 for n in unv if n))
