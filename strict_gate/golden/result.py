"""The golden's section of a gate: its vote at each first divergence, its check of the
reference's own tokens, and the one rule by which it touches the exit code (docs/golden.md).

Informational by default: the votes annotate. With `blame = true`, a gate whose tokens fail
and whose every failing prompt has the reference off the golden (by more than the band) and the
candidate on it exits 6 (REFERENCE_OFF_GOLDEN) instead of 1: still not a pass, but a caller
learns that the oracle is the side to look at. A vote the golden could not give is "incomplete" (exit 3 when the tokens
pass), never a silent agreement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strict_gate.errors import ExitCode
from strict_gate.golden.variants import VariantVotes
from strict_gate.golden.vote import Disagreement, Side, Vote
from strict_gate.runs.records import EngineInfo


@dataclass(frozen=True)
class PromptVote:
    """One diverged prompt's vote, or why there is none."""

    id: str
    position: int
    vote: Vote | None
    error: str | None = None


@dataclass(frozen=True)
class CheckedPrompt:
    """One reference record through the golden, or why it was not checked."""

    id: str
    check: Disagreement | None
    error: str | None = None


@dataclass(frozen=True)
class HealthCheck:
    """The reference's own tokens through the golden: one entry per prompt checked, or why not."""

    band: float  # a disagreement above it is the oracle off the golden (strict-gate golden exits 1)
    prompts: tuple[CheckedPrompt, ...]

    @property
    def off(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.prompts if p.check is not None and p.check.first is not None)

    @property
    def beyond_band(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.prompts if p.check is not None and any(
            g is None or g > self.band for g in p.check.gaps))

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.prompts if p.error is not None)

    def line(self) -> str:
        n = len(self.prompts)
        head = f"the reference's greedy tokens are off the golden's argmax on {len(self.off)} of {n} prompt(s)"
        largest = max((g for p in self.prompts if p.check is not None and (g := p.check.largest) is not None),
                      default=None)
        tail = "" if largest is None else f", largest gap {largest:.4g} ({len(self.beyond_band)} above band {self.band:g})"
        failed = f"; {len(self.failed)} not checked (the golden could not score)" if self.failed else ""
        return head + tail + failed

    @property
    def exit_code(self) -> ExitCode:
        """`strict-gate golden`'s: 3 when a prompt went unchecked, 1 when the oracle is off the golden
        beyond the band anywhere, else 0 (a disagreement within the band is two precisions' near-tie)."""
        if self.failed:
            return ExitCode.ENGINE_FAILURE
        return ExitCode.FAIL if self.beyond_band else ExitCode.PASS


@dataclass(frozen=True)
class GoldenResult:
    """What report.json's `golden` section holds (judge/result.py's FeatureResult)."""

    golden: EngineInfo | None  # None: it never started
    blame: bool  # the config's `blame`
    band: float  # the gate's: a reference gap within it is a near-tie, too close for blame
    failing: tuple[str, ...]  # the prompts the token verdict fails (or leaves unverified), by id
    votes: tuple[PromptVote, ...]
    health: HealthCheck | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    variants: VariantVotes | None = None  # its votes at the [invariance] moves; None: the gate ran no variant

    @property
    def unvoted(self) -> tuple[str, ...]:
        return tuple(v.id for v in self.votes if v.vote is None)

    def side_count(self, side: Side) -> int:
        return sum(1 for v in self.votes if v.vote is not None and v.vote.side is side)

    @property
    def reference_off(self) -> bool:
        """Every failing prompt (at least one) has the reference off the golden by more than the band
        and the candidate on it."""
        by_id = {v.id: v.vote for v in self.votes}
        return bool(self.failing) and all((vt := by_id.get(p)) is not None and vt.reference_off
                                          and vt.reference_gap > self.band for p in self.failing)

    @property
    def incomplete(self) -> bool:
        return bool(self.unvoted) or (self.health is not None and bool(self.health.failed))

    @property
    def exit_code(self) -> int:
        if self.blame and self.reference_off and not self.incomplete:
            return ExitCode.REFERENCE_OFF_GOLDEN
        return ExitCode.ENGINE_FAILURE if self.incomplete else ExitCode.PASS

    @property
    def section_verdict(self) -> str:
        if self.incomplete:
            return "incomplete"
        if self.reference_off:
            return "reference off the golden"
        return "informational"

    def headline(self) -> str:
        """The section's one line: the votes, and what they say about the reference."""
        if not self.votes:
            head = "no divergence to vote on"
        else:
            head = (f"golden votes at {len(self.votes)} first divergence(s): reference {self.side_count(Side.REFERENCE)}, "
                    f"candidate {self.side_count(Side.CANDIDATE)}, neither {self.side_count(Side.NEITHER)}")
        if self.unvoted:
            head += f", not voted {len(self.unvoted)} (incomplete)"
        if self.reference_off:
            head += (f"; the REFERENCE is off the golden beyond the band at every failing prompt ({len(self.failing)}), "
                     "the candidate on it" + ("" if self.blame else " (blame = false: informational)"))
        if self.variants is not None:  # informational: never in exit_code nor section_verdict
            head += f"; {self.variants.headline()}"
        return head

    def to_json(self) -> dict:
        return {
            "golden": None if self.golden is None else self.golden.to_json(),
            "blame": self.blame,
            "band": self.band,
            "failing": list(self.failing),
            "headline": self.headline(),
            "votes": [_vote_json(v) for v in self.votes],
            "health": None if self.health is None else health_json(self.health),
            "notes": list(self.notes),
            "variant_votes": None if self.variants is None else self.variants.to_json(),
        }


def _vote_json(v: PromptVote) -> dict:
    vt = v.vote
    return {"id": v.id, "position": v.position, "error": v.error,
            "side": None if vt is None else str(vt.side),
            "golden_argmax": None if vt is None else vt.golden_argmax,
            "reference_token": None if vt is None else vt.reference_token,
            "candidate_token": None if vt is None else vt.candidate_token,
            "reference_gap": None if vt is None else vt.reference_gap,
            "candidate_gap": None if vt is None else vt.candidate_gap}


def health_json(h: HealthCheck) -> dict:
    return {"band": h.band, "line": h.line(), "prompts": [
        {"id": p.id, "error": p.error, "positions": None if (d := p.check) is None else d.positions,
         "first": None if d is None else d.first, "gaps": [] if d is None else list(d.gaps)}
        for p in h.prompts]}
