"""A third engine's vote at a first divergence, and its check of the reference's own tokens.

At a first divergence d both arms emitted the same tokens up to d and differ at d. The golden
(a higher-precision engine: transformers in float64) is teacher-forced on that shared prefix
and names its argmax at d: it sides with the arm whose token that is, and both gaps say how far
each side's token sits below it. `vote` is the one function every caller shares (the gate's
first divergences here; an invariance variant's later), so a vote means the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from strict_gate.runs.records import ScoredStep

K = 5  # the golden's top-k asked for: its argmax and the logprobs of the two tokens are what count


class GoldenScorer(Protocol):
    """What a vote needs of the golden engine (an `Engine` with the `score` capability)."""

    def scoped_env(self) -> AbstractContextManager[object]: ...

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]: ...


class Side(StrEnum):
    """Whose token at the divergence is the golden's argmax."""

    REFERENCE = "reference"  # the candidate is off the golden
    CANDIDATE = "candidate"  # the reference is off the golden (vLLM issue 40956's class)
    NEITHER = "neither"  # both are off it


@dataclass(frozen=True)
class Vote:
    """The golden's vote at one divergence: its argmax and each side's gap below it (nats, >= 0)."""

    position: int
    golden_argmax: int
    reference_token: int
    candidate_token: int
    reference_gap: float  # lp_golden(argmax) - lp_golden(reference's token)
    candidate_gap: float  # lp_golden(argmax) - lp_golden(candidate's token)

    @property
    def side(self) -> Side:
        if self.golden_argmax == self.reference_token:
            return Side.REFERENCE
        return Side.CANDIDATE if self.golden_argmax == self.candidate_token else Side.NEITHER

    @property
    def reference_off(self) -> bool:
        """The reference's token is off the golden and the candidate's on it: what `blame` names."""
        return self.side is Side.CANDIDATE

    def line(self) -> str:
        """One line for a reviewer."""
        gaps = f"golden gaps: reference {self.reference_gap:.4g}, candidate {self.candidate_gap:.4g}"
        words = {Side.REFERENCE: "the golden sides with the reference (the candidate is off the golden)",
                 Side.CANDIDATE: "the golden sides with the candidate: the REFERENCE is off the golden",
                 Side.NEITHER: f"the golden's argmax is neither side's token ({self.golden_argmax})"}
        return f"position {self.position}: {words[self.side]}; {gaps}"


class GoldenError(Exception):
    """The golden gave no usable scoring at the divergence: its vote is unknown, never assumed."""


def _logprob(step: ScoredStep, token: int) -> float | None:
    if token == step.token_id and step.logprob is not None:
        return step.logprob
    return next((v for t, v in step.top if t == token), None)


def _at(golden: GoldenScorer, prompt_ids: Sequence[int], prefix_ids: Sequence[int], token: int) -> ScoredStep:
    """The golden's scoring of `token` after prompt + prefix (one step: the last)."""
    with golden.scoped_env():
        steps = golden.score(list(prompt_ids), [*prefix_ids, token], K)
    if len(steps) != len(prefix_ids) + 1 or not steps[-1].top:
        raise GoldenError(f"the golden scored {len(steps)} of {len(prefix_ids) + 1} positions")
    return steps[-1]


def vote(golden: GoldenScorer, prompt_ids: Sequence[int], prefix_ids: Sequence[int], ref_token: int,
         cand_token: int) -> Vote:
    """The golden's vote at position len(prefix_ids), teacher-forced on the shared prefix; each
    token's logprob is read where the golden scored that very token (a second pass for the
    candidate's when the first pass's top-k lacks it). GoldenError when it cannot say."""
    first = _at(golden, prompt_ids, prefix_ids, ref_token)
    lp_ref = _logprob(first, ref_token)
    lp_cand = _logprob(first, cand_token)
    if lp_cand is None:
        lp_cand = _logprob(_at(golden, prompt_ids, prefix_ids, cand_token), cand_token)
    if lp_ref is None or lp_cand is None:
        raise GoldenError("the golden gave no logprob for a side's token")
    # a side's token scored above the golden's own top-1 is its argmax (no gap below 0); a tie keeps its top-1
    argmax, top_lp = max([first.top[0], (ref_token, lp_ref), (cand_token, lp_cand)], key=lambda p: p[1])
    return Vote(len(prefix_ids), argmax, ref_token, cand_token, top_lp - lp_ref, top_lp - lp_cand)


@dataclass(frozen=True)
class Disagreement:
    """The golden's check of one reference record on its own prefix: where its greedy tokens are
    not the golden's argmax (None: nowhere), and by how much."""

    positions: int  # the reference's tokens scored
    first: int | None  # the first position whose token is not the golden's argmax
    gaps: tuple[float | None, ...]  # lp_golden(argmax) - lp_golden(token) at each, in order; None: outside its top-k

    @property
    def largest(self) -> float | None:
        known = [g for g in self.gaps if g is not None]
        return max(known) if known else None


def check_record(golden: GoldenScorer, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> Disagreement:
    """The reference's tokens teacher-forced through the golden (one pass): every position whose
    token is not the golden's argmax, with its gap. GoldenError when the scoring is short."""
    if not token_ids:
        return Disagreement(0, None, ())
    with golden.scoped_env():
        steps = golden.score(list(prompt_ids), list(token_ids), K)
    if len(steps) != len(token_ids):
        raise GoldenError(f"the golden scored {len(steps)} of {len(token_ids)} positions")
    off = []
    for i, step in enumerate(steps):
        if not step.top:
            raise GoldenError(f"the golden gave no top-k at position {i}")
        if step.argmax != step.token_id:
            lp = _logprob(step, step.token_id)
            off.append((i, None if lp is None else max(0.0, step.top[0][1] - lp)))
    return Disagreement(len(steps), off[0][0] if off else None, tuple(g for _, g in off))
