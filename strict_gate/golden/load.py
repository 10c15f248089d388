"""The golden's section back from report.json (`features.golden`), through the shape it is
declared as, so a command that rewrites a finished report (diagnose, localize, resume) keeps the
votes it did not redo: the golden is not started again. What `to_json` derives (the headline,
the side of each vote, the health line) is derived again, not read."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from strict_gate.core.sections import Shape, read_section
from strict_gate.errors import InputError
from strict_gate.golden.result import CheckedPrompt, GoldenResult, HealthCheck, PromptVote
from strict_gate.golden.variants import MoveVote, VariantVotes
from strict_gate.golden.vote import Disagreement, Side, Vote
from strict_gate.judge.schema import EngineDoc, TokenId
from strict_gate.runs.records import EngineInfo

Count = Annotated[int, msgspec.Meta(ge=0)]
Gap = Annotated[float, msgspec.Meta(ge=0)]


class _Vote(Shape, frozen=True):
    id: str
    position: Count
    error: str | None
    side: Side | None  # derived
    golden_argmax: TokenId | None
    reference_token: TokenId | None
    candidate_token: TokenId | None
    reference_gap: Gap | None
    candidate_gap: Gap | None


class _Checked(Shape, frozen=True):
    id: str
    error: str | None
    positions: Count | None
    first: Count | None
    gaps: list[Gap | None]


class HealthShape(Shape, frozen=True):
    band: float
    line: str  # derived
    prompts: list[_Checked]


class _MoveVote(Shape, frozen=True):
    arm: str
    variant: str
    id: str
    position: Count
    error: str | None
    side: Literal["batch-1", "variant", "neither"] | None  # derived
    golden_argmax: TokenId | None
    batch1_token: TokenId | None
    variant_token: TokenId | None
    batch1_gap: Gap | None
    variant_gap: Gap | None


class VariantVotesShape(Shape, frozen=True):
    cap: Count
    moves: Count
    verdict: Literal["informational", "unjudged"]  # derived
    headline: str  # derived
    votes: list[_MoveVote]


class GoldenSection(Shape, frozen=True):
    golden: EngineDoc | None
    blame: bool
    band: float
    failing: list[str]
    headline: str  # derived
    votes: list[_Vote]
    health: HealthShape | None
    notes: list[str]
    variant_votes: VariantVotesShape | None = None  # absent in reports written before the variant votes


def _vote(v: _Vote) -> PromptVote:
    if v.golden_argmax is None or v.reference_token is None or v.candidate_token is None \
            or v.reference_gap is None or v.candidate_gap is None:
        return PromptVote(v.id, v.position, None, v.error or "not stored")
    return PromptVote(v.id, v.position, Vote(v.position, v.golden_argmax, v.reference_token, v.candidate_token,
                                             v.reference_gap, v.candidate_gap), v.error)


def _move(v: _MoveVote) -> MoveVote:
    if v.golden_argmax is None or v.batch1_token is None or v.variant_token is None \
            or v.batch1_gap is None or v.variant_gap is None:
        return MoveVote(v.arm, v.variant, v.id, v.position, None, v.error or "not stored")
    return MoveVote(v.arm, v.variant, v.id, v.position, Vote(v.position, v.golden_argmax, v.batch1_token,
                                                             v.variant_token, v.batch1_gap, v.variant_gap), v.error)


def read_variants(s: VariantVotesShape, band: float) -> VariantVotes:
    """The variant votes as written; more votes than moves, or than the cap, is no section the writer makes."""
    if len(s.votes) > min(s.moves, s.cap):
        raise InputError(f"report.json's golden: field variant_votes.votes: {len(s.votes)} votes for "
                         f"{s.moves} move(s) under a cap of {s.cap}")
    return VariantVotes(s.cap, s.moves, tuple(_move(v) for v in s.votes), band)


def read_health(h: HealthShape) -> HealthCheck:
    return HealthCheck(h.band, tuple(
        CheckedPrompt(p.id, None if p.positions is None else Disagreement(p.positions, p.first, tuple(p.gaps)), p.error)
        for p in h.prompts))


def load_golden(d: dict) -> GoldenResult:
    """The GoldenResult whose `to_json()` is `d`; InputError naming the field when it is not one."""
    s = read_section(d, GoldenSection, "golden")
    g = s.golden
    golden = None if g is None else EngineInfo.from_json({f: getattr(g, f) for f in g.__struct_fields__})
    return GoldenResult(golden, s.blame, s.band, tuple(s.failing), tuple(_vote(v) for v in s.votes),
                        None if s.health is None else read_health(s.health), tuple(s.notes),
                        None if s.variant_votes is None else read_variants(s.variant_votes, s.band))
