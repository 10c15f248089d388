"""The golden driven over a judged gate: its vote at every first divergence, and (check_reference)
its check of every reference record. Every failure becomes a stated unknown on the prompts it
touches: a golden that cannot start or score leaves the section incomplete, never agreeing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from strict_gate.golden.result import CheckedPrompt, HealthCheck, PromptVote
from strict_gate.golden.vote import GoldenScorer, check_record, vote
from strict_gate.judge.compare import PromptComparison
from strict_gate.judge.policy import Verdict
from strict_gate.runs.records import Record


class Golden(GoldenScorer, Protocol):
    """The golden engine as the gate holds it: started once, then asked to score."""

    @property
    def can_score(self) -> bool: ...

    def start(self) -> None: ...


def started(golden: Golden) -> str | None:
    """Start the golden once; why it cannot vote, or None when it can."""
    try:
        with golden.scoped_env():
            golden.start()
    except Exception as e:
        return f"the golden did not start: {type(e).__name__}: {e}"
    return None if golden.can_score else "the golden cannot score (its engine declares no `score`)"


def diverged(prompts: tuple[PromptComparison, ...] | list[PromptComparison]) -> list[PromptComparison]:
    """The prompts with a first divergence where both arms emitted a token: what the golden votes on."""
    return [p for p in prompts if (d := p.first_divergence) is not None
            and d.reference_token is not None and d.candidate_token is not None]


def failing(verdict: Verdict) -> tuple[str, ...]:
    """The prompts the token verdict does not pass (failed or unverified), by id."""
    return tuple(p.id for p in verdict.prompts if not p.passed)


def vote_all(golden: Golden, prompts: list[PromptComparison], reference: Mapping[str, Record],
             why_not: str | None) -> tuple[PromptVote, ...]:
    """The golden's vote at each prompt's first divergence, on the reference's prompt and prefix
    (the candidate's up to there is the same); `why_not`: it cannot vote, said on every prompt."""
    out = []
    for p in prompts:
        d = p.first_divergence
        assert d is not None and d.reference_token is not None and d.candidate_token is not None  # diverged()
        if why_not is not None:
            out.append(PromptVote(p.id, d.position, None, why_not))
            continue
        ref = reference[p.id]
        try:
            v = vote(golden, ref.prompt_token_ids, ref.token_ids[: d.position], d.reference_token, d.candidate_token)
        except Exception as e:
            out.append(PromptVote(p.id, d.position, None, f"{type(e).__name__}: {e}"))
            continue
        out.append(PromptVote(p.id, d.position, v))
    return tuple(out)


def check_reference(golden: Golden, reference: Mapping[str, Record], ids: list[str], band: float,
                    why_not: str | None) -> HealthCheck:
    """The reference's own tokens, every prompt in `ids`, teacher-forced through the golden."""
    rows: list[CheckedPrompt] = []
    for pid in ids:
        rec = reference.get(pid)
        if why_not is not None or rec is None or rec.error is not None:
            rows.append(CheckedPrompt(pid, None, why_not or "the reference has no tokens for it"))
            continue
        try:
            rows.append(CheckedPrompt(pid, check_record(golden, rec.prompt_token_ids, rec.token_ids)))
        except Exception as e:
            rows.append(CheckedPrompt(pid, None, f"{type(e).__name__}: {e}"))
    return HealthCheck(band, tuple(rows))
