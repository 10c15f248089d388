"""Pass/fail policies. The policy is explicit in every report and cannot pass vacuously.

strict          every prompt matches token for token
near-tie        every prompt matches or diverges at a near-tie (both gaps within the band)
distributional  the candidate's tokens equal one of the reference's K captured samples
auto            strict where the reference's samples agree (or none were captured),
                distributional where the reference itself disagrees across runs
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from strict_gate.errors import ConfigError
from strict_gate.judge.compare import UNCOMPARED, Comparison, Status
from strict_gate.runs.records import Record


class Policy(StrEnum):
    """The rule a gate is judged by; the value is how configs, the CLI and reports spell it."""

    STRICT = "strict"
    NEAR_TIE = "near-tie"
    DISTRIBUTIONAL = "distributional"
    AUTO = "auto"


class VerdictKind(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


POLICIES = tuple(p.value for p in Policy)


@dataclass(frozen=True)
class PromptVerdict:
    id: str
    passed: bool
    rule: Policy  # the rule applied to this prompt: strict | near-tie | distributional
    reason: str


@dataclass(frozen=True)
class Verdict:
    verdict: VerdictKind
    policy: Policy
    band: float
    prompts: tuple[PromptVerdict, ...]
    reasons: tuple[str, ...]  # why it passed or failed, in words, most important first
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return {VerdictKind.PASS: 0, VerdictKind.FAIL: 1}.get(self.verdict, 3)


def check_policy(policy: Policy | str) -> Policy:
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    return Policy(policy)


def _samples_agree(rec: Record | None) -> bool | None:
    """True/False when the reference captured K>1 runs; None when it did not."""
    if rec is None or rec.samples is None or len(rec.samples) < 2:
        return None
    return all(s == rec.samples[0] for s in rec.samples[1:])


def apply_policy(
    comparison: Comparison,
    policy: Policy | str,
    reference: Mapping[str, Record],
    candidate: Mapping[str, Record],
    *,
    run_problems: tuple[str, ...] = (),
) -> Verdict:
    """Judge a comparison. run_problems (an arm that failed or stopped early) force incomplete:
    a gate whose engine died is an engine failure (exit 3) even where the prompts done diverge."""
    policy = check_policy(policy)
    if policy == Policy.DISTRIBUTIONAL:
        lacking = [p.id for p in comparison.prompts if reference.get(p.id) is not None and reference[p.id].samples is None]
        if lacking:
            raise ConfigError(
                f"policy 'distributional' needs the reference's samples, and {len(lacking)} prompt(s) have none "
                f"(first: {lacking[0]!r}); capture a baseline with `strict-gate capture --runs K` or pick "
                "another policy"
            )
    verdicts: list[PromptVerdict] = []
    notes: list[str] = []
    unsampled = 0
    for pc in comparison.prompts:
        rule = policy
        if policy == Policy.AUTO:
            agree = _samples_agree(reference.get(pc.id))
            if agree is None:
                unsampled += 1
            rule = Policy.DISTRIBUTIONAL if agree is False else Policy.STRICT
        if pc.status in UNCOMPARED:
            verdicts.append(PromptVerdict(pc.id, False, rule, f"{pc.status}: {pc.detail}"))
            continue
        if pc.status == Status.TOKENIZATION_MISMATCH:
            verdicts.append(PromptVerdict(pc.id, False, rule, f"tokenization mismatch: {pc.detail}"))
            continue
        if pc.status == Status.NOT_GREEDY:  # fails every policy: the arm did not decode greedily
            verdicts.append(PromptVerdict(pc.id, False, rule, f"not greedy: {pc.detail}"))
            continue
        if rule == Policy.DISTRIBUTIONAL:
            rec, cand = reference[pc.id], candidate[pc.id]
            hit = next((k for k, s in enumerate(rec.samples or ()) if s == cand.token_ids), None)
            if hit is None:
                verdicts.append(
                    PromptVerdict(pc.id, False, rule, f"equals none of the reference's {len(rec.samples or ())} samples")
                )
            else:
                verdicts.append(PromptVerdict(pc.id, True, rule, f"equals reference sample {hit}"))
            continue
        if pc.status == Status.MATCH:
            verdicts.append(PromptVerdict(pc.id, True, rule, "exact match"))
        elif pc.status == Status.NEAR_TIE and rule == Policy.NEAR_TIE:
            d = pc.first_divergence
            verdicts.append(
                PromptVerdict(pc.id, True, rule, f"near-tie at position {d.position}: {d.reason}")
            )
        else:
            d = pc.first_divergence
            where = f" at position {d.position}" if d else ""
            why = f": {d.reason}" if d else ""
            extra = " (a near-tie fails under strict)" if pc.status == Status.NEAR_TIE else ""
            verdicts.append(PromptVerdict(pc.id, False, rule, f"{pc.status}{where}{why}{extra}"))
    if policy == Policy.AUTO:
        if unsampled == len(comparison.prompts) and comparison.prompts:
            notes.append(
                "auto: the reference has no repeated samples, so its determinism is unmeasured; strict applied"
            )
        elif unsampled:
            notes.append(f"auto: {unsampled} prompt(s) without reference samples were judged strictly")
        nd = sum(1 for v in verdicts if v.rule == Policy.DISTRIBUTIONAL)
        if nd:
            notes.append(f"auto: {nd} prompt(s) where the reference disagrees with itself were judged distributionally")

    s = comparison.summary
    failed = [v for v in verdicts if not v.passed]
    uncompared = [pc for pc in comparison.prompts if pc.status in UNCOMPARED]
    failing = [v for v in failed if v.id not in {pc.id for pc in uncompared}]
    reasons: list[str] = []
    if run_problems:
        verdict = VerdictKind.INCOMPLETE
        reasons += list(run_problems)
        reasons.append(f"{len(uncompared)} of {s.prompts_total} prompt(s) were not compared")
        reasons += [f"{v.id}: {v.reason}" for v in failing[:20]]
    elif failing:
        verdict = VerdictKind.FAIL
        reasons.append(f"{len(failing)} of {s.prompts_total} prompt(s) fail policy {policy.value!r}")
        reasons += [f"{v.id}: {v.reason}" for v in failing[:20]]
        if len(failing) > 20:
            reasons.append(f"... and {len(failing) - 20} more")
    elif s.prompts_total == 0:
        verdict = VerdictKind.INCOMPLETE
        reasons.append("zero prompts were compared: an empty gate proves nothing")
    elif uncompared:
        verdict = VerdictKind.INCOMPLETE
        reasons.append(f"{len(uncompared)} of {s.prompts_total} prompt(s) were not compared")
        reasons += [f"{pc.id}: {pc.status}: {pc.detail}" for pc in uncompared[:20]]
    elif s.positions_total == 0:
        verdict = VerdictKind.INCOMPLETE
        reasons.append("zero token positions were compared (every record is empty): an empty gate proves nothing")
    else:
        verdict = VerdictKind.PASS
        reasons.append(f"all {s.prompts_total} prompts pass policy {policy.value!r}")
    if uncompared and verdict == VerdictKind.FAIL:
        reasons.append(f"also {len(uncompared)} prompt(s) not compared (missing or errored)")
    return Verdict(verdict, policy, comparison.band, tuple(verdicts), tuple(reasons), tuple(notes))
