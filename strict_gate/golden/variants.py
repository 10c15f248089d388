"""The golden's vote at each [invariance] variant's first moved position (issue 52).

A variant moved a prompt when its tokens differ from its own arm's batch-1 run: both runs emitted
the same tokens up to the first moved position d and differ at d. The golden is teacher-forced on
the prompt and that shared prefix (vote.py's `vote`, the one voting function: the batch-1 token in
the reference's slot, the variant's in the candidate's) and sides with `batch-1`, the `variant`
or `neither`, with both gaps. Informational: the votes never change an exit code. A move on the
REFERENCE arm where the golden sides with the variant's token, the batch-1 token beyond the band
below the golden's argmax, is vLLM issue 40956's signal: the reference's own variant (its chunked
prefill) is right and its batch-1 run (its whole prefill) wrong. Within the band it is a near-tie
(bf16 rounding splits those about evenly): neither run is wrong, and it is said so. A vote the
golden could not give is `unjudged`, never an agreement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strict_gate.golden.vote import GoldenScorer, Side, Vote, vote
from strict_gate.runs.records import Record

DEFAULT_CAP = 64  # moves voted on at most, in the invariance result's order ([golden] `variant_votes`)
SIDES = {Side.REFERENCE: "batch-1", Side.CANDIDATE: "variant", Side.NEITHER: "neither"}
REFERENCE = "reference"


@dataclass(frozen=True)
class Move:
    """One prompt a variant moved: where, on which shared prefix, and both tokens there."""

    arm: str
    variant: str
    id: str
    position: int
    prefix: tuple[int, ...]  # the batch-1 run's tokens before `position` (the variant's are the same)
    batch1_token: int
    variant_token: int


@dataclass(frozen=True)
class MoveVote:
    """The golden's vote at one move (reference slot: the batch-1 token), or why there is none."""

    arm: str
    variant: str
    id: str
    position: int
    vote: Vote | None
    error: str | None = None

    @property
    def side(self) -> str | None:
        return None if self.vote is None else SIDES[self.vote.side]

    def reference_right_in_variant(self, band: float) -> bool:
        """On the reference arm the golden's argmax is the variant's token and the batch-1 token sits
        beyond the band below it: the reference's batch-1 run is the side off."""
        return self.arm == REFERENCE and self.vote is not None and self.side == "variant" \
            and self.vote.reference_gap > band

    def line(self, band: float) -> str:
        where = f"golden at {self.arm}:{self.variant}: {self.id}: position {self.position}"
        if (v := self.vote) is None:
            return f"{where}: no vote (unjudged): {self.error}"
        gaps = f"golden gaps: batch-1 {v.reference_gap:.4g}, variant {v.candidate_gap:.4g}"
        words = {"batch-1": "the golden sides with batch-1 (the variant moved off the golden)",
                 "variant": "the golden sides with the variant (its batch-1 run is off the golden)",
                 "neither": f"the golden's argmax is neither token ({v.golden_argmax})"}[SIDES[v.side]]
        signal = (": the REFERENCE's own variant is right, its batch-1 run wrong" if self.reference_right_in_variant(band)
                  else f" (within the band {band:g}: a near-tie, neither run is wrong)" if v.side != Side.NEITHER
                  and max(v.reference_gap, v.candidate_gap) <= band else "")
        return f"{where}: {words}{signal}; {gaps}"


@dataclass(frozen=True)
class VariantVotes:
    """Every variant move the golden voted on (at most `cap`), and how many there were."""

    cap: int
    moves: int  # moves where both runs emitted a token at the first moved position
    votes: tuple[MoveVote, ...]
    band: float  # the gate's: a batch-1 token within it of the golden's argmax is a near-tie, not wrong

    @property
    def unjudged(self) -> tuple[MoveVote, ...]:
        return tuple(v for v in self.votes if v.vote is None)

    @property
    def beyond_cap(self) -> int:
        return self.moves - len(self.votes)

    def count(self, side: str) -> int:
        return sum(1 for v in self.votes if v.side == side)

    @property
    def reference_right_in_variant(self) -> tuple[MoveVote, ...]:
        return tuple(v for v in self.votes if v.reference_right_in_variant(self.band))

    @property
    def reference_near_ties(self) -> tuple[MoveVote, ...]:
        """Reference-arm moves the golden sides with the variant on, within the band: near-ties."""
        return tuple(v for v in self.votes if v.arm == REFERENCE and v.side == "variant"
                     and not v.reference_right_in_variant(self.band))

    @property
    def verdict(self) -> str:
        """`unjudged` when a move went without its vote (the golden failed, or the cap stopped it),
        else `informational`: never a pass, never an exit code."""
        return "unjudged" if self.unjudged or self.beyond_cap else "informational"

    def headline(self) -> str:
        head = (f"variants: {self.moves} move(s), golden with batch-1 at {self.count('batch-1')}, with the variant at "
                f"{self.count('variant')}, neither {self.count('neither')}")
        if self.unjudged:
            head += f", not voted {len(self.unjudged)} (unjudged)"
        if self.beyond_cap:
            head += f", {self.beyond_cap} beyond the cap of {self.cap} not voted (unjudged)"
        if (ref := self.reference_right_in_variant):
            names = ", ".join(dict.fromkeys(v.variant for v in ref))
            head += (f"; on the REFERENCE arm the golden sides with the variant's token, the batch-1 token beyond the "
                     f"band {self.band:g}, at {len(ref)} move(s) ({names}): the reference's own variant is right and "
                     "its batch-1 run wrong (vLLM issue 40956's signal)")
        if (near := self.reference_near_ties):
            head += (f"; on the REFERENCE arm {len(near)} move(s) side with the variant within the band {self.band:g}: "
                     "near-ties, neither run wrong")
        return head

    def to_json(self) -> dict:
        return {"cap": self.cap, "moves": self.moves, "verdict": self.verdict, "headline": self.headline(),
                "votes": [_json(v) for v in self.votes]}


def _json(m: MoveVote) -> dict:
    v = m.vote
    return {"arm": m.arm, "variant": m.variant, "id": m.id, "position": m.position, "error": m.error,
            "side": m.side, "golden_argmax": None if v is None else v.golden_argmax,
            "batch1_token": None if v is None else v.reference_token,
            "variant_token": None if v is None else v.candidate_token,
            "batch1_gap": None if v is None else v.reference_gap,
            "variant_gap": None if v is None else v.candidate_gap}


def _one(golden: GoldenScorer, m: Move, prompts: Mapping[str, Record], seen: dict[tuple, Vote]) -> MoveVote:
    rec = prompts.get(m.id)
    if rec is None:
        return MoveVote(m.arm, m.variant, m.id, m.position, None, "no prompt tokens for it in the reference's run")
    key = (m.id, m.prefix, m.batch1_token, m.variant_token)  # a move two arms share is voted once
    try:
        if key not in seen:
            seen[key] = vote(golden, rec.prompt_token_ids, m.prefix, m.batch1_token, m.variant_token)
    except Exception as e:
        return MoveVote(m.arm, m.variant, m.id, m.position, None, f"{type(e).__name__}: {e}")
    return MoveVote(m.arm, m.variant, m.id, m.position, seen[key])


def vote_moves(golden: GoldenScorer, moves: Sequence[Move], prompts: Mapping[str, Record], cap: int,
               why_not: str | None, band: float) -> VariantVotes:
    """The golden's vote at the first `cap` moves, teacher-forced on each prompt (the reference's
    run: the gate feeds both arms the same ids) and the shared prefix; `why_not`: it cannot vote."""
    seen: dict[tuple, Vote] = {}
    votes = tuple(MoveVote(m.arm, m.variant, m.id, m.position, None, why_not) if why_not is not None
                  else _one(golden, m, prompts, seen) for m in moves[:cap])
    return VariantVotes(cap, len(moves), votes, band)
