"""Pass/fail policies. The policy is explicit in every report and cannot pass vacuously.

strict          every prompt matches token for token (a text-only server's equal text is not
                enough where it re-tokenises to other ids or its usage counts others)
near-tie        every prompt matches, or diverges at a near-tie (both gaps within the band)
                after which EVERY later candidate token, judged on the candidate's own prefix
                (judge/cascade.py), is the reference's argmax there or a further near-tie
distributional  the candidate's tokens equal one of the reference's K captured samples
auto            strict where the reference's samples agree (or none were captured),
                distributional where the reference itself disagrees across runs
near-tie-reference-only
                ONE-SIDED, WEAKER: every prompt matches, or diverges where the reference's
                re-scored gap is within the band at the first divergence and at every later
                position (judge/cascade.py's judge_later, one-sided: the reference teacher-
                forced on the candidate's tokens); the candidate's own gap is never asked for.
                The bar for a text-only server, whose own margin cannot be known (vllm.cpp's
                own gate is this rule). Every report says so in its verdict line (ONE_SIDED).

Only near-tie accepts a near-tie; auto and distributional accept a divergence only as an
exact copy of a reference sample, so no rule passes a token after a flip unjudged. A near-tie
prompt whose later positions could not all be judged (no re-scoring: diagnose = false, a stored
reference without [rescorer], a failed rescorer, fewer steps scored) is unverified: never a
pass, counted with the incomplete verdicts (exit 3) unless another prompt fails. So is one whose
candidate stopped early (finish "stop", fewer than max_tokens tokens) on an id not known to end a
sequence (cascade.stop_problem): the positions it never generated are not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from strict_gate.errors import ConfigError, ExitCode
from strict_gate.judge.cascade import Cascade, Later
from strict_gate.judge.compare import UNCOMPARED, Comparison, PromptComparison, Status
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.judge.one_sided import reference_only
from strict_gate.judge.text_only import strict_problem
from strict_gate.runs.records import Record


class Policy(StrEnum):
    """The rule a gate is judged by; the value is how configs, the CLI and reports spell it."""

    STRICT = "strict"
    NEAR_TIE = "near-tie"
    DISTRIBUTIONAL = "distributional"
    AUTO = "auto"
    NEAR_TIE_REFERENCE_ONLY = "near-tie-reference-only"

    @property
    def one_sided(self) -> bool:
        """Judged from the reference's side alone: weaker than the two-sided near-tie."""
        return self is Policy.NEAR_TIE_REFERENCE_ONLY


class VerdictKind(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


POLICIES = tuple(p.value for p in Policy)
ONE_SIDED = ("one-sided and weaker: a divergence passes on the reference's re-scored gaps alone (within the band "
             "at the first divergence and every later position); the candidate's own gap is not known")
NAMED = 20  # failing (or uncompared) prompts named in a verdict's reasons
UNJUDGED = ("no engine re-scored the candidate's continuation (diagnose = false, or a reference that cannot "
            "score and no [rescorer])")


@dataclass(frozen=True)
class PromptVerdict:
    id: str
    passed: bool
    rule: Policy  # the rule applied to this prompt: strict | near-tie | distributional
    reason: str
    unverified: bool = False  # not passed because part of it could not be judged (counted as incomplete)

    @property
    def outcome(self) -> str:
        return "pass" if self.passed else "unverified" if self.unverified else "fail"


@dataclass(frozen=True)
class Verdict:
    verdict: VerdictKind
    policy: Policy
    band: float
    prompts: tuple[PromptVerdict, ...]
    reasons: tuple[str, ...]  # why it passed or failed, in words, most important first
    notes: tuple[str, ...] = ()

    @property
    def policy_words(self) -> str:
        """The policy as a verdict line names it: a one-sided policy says that it is one."""
        return f"{self.policy} ({ONE_SIDED})" if Policy(self.policy).one_sided else str(self.policy)

    @property
    def exit_code(self) -> ExitCode:
        return {VerdictKind.PASS: ExitCode.PASS, VerdictKind.FAIL: ExitCode.FAIL}.get(
            self.verdict, ExitCode.ENGINE_FAILURE)


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
    later: Mapping[str, Cascade] | None = None,
    diagnoses: Mapping[str, Diagnosis] | None = None,
    stops: Mapping[str, str] | None = None,
) -> Verdict:
    """Judge a comparison. run_problems (an arm that failed or stopped early) force incomplete:
    a gate whose engine died is an engine failure (exit 3) even where the prompts done diverge.
    `later`: each diverged prompt's later positions judged (cross_check); a near-tie without
    one, with positions after its flip, is unverified. `diagnoses` (the reference's re-scoring)
    is what policy near-tie-reference-only judges by. `stops`: why a prompt's early stop is not
    judged (cascade.stop_problem); a near-tie with one is unverified."""
    policy = check_policy(policy)
    if policy == Policy.DISTRIBUTIONAL:
        _require_samples(comparison, reference)
    later, stops = later or {}, stops or {}
    verdicts = tuple(
        _stopped(_prompt_verdict(pc, _rule(policy, reference.get(pc.id)), reference, candidate, later.get(pc.id),
                                 (diagnoses or {}).get(pc.id), comparison.band), pc, stops.get(pc.id))
        for pc in comparison.prompts
    )
    notes = _auto_notes(comparison, verdicts, reference) if policy == Policy.AUTO else ()
    if policy.one_sided:
        notes = (f"policy {policy}: {ONE_SIDED}",)
    verdict, reasons = _outcome(comparison, verdicts, policy, run_problems)
    return Verdict(verdict, policy, comparison.band, verdicts, reasons, notes)


def _stopped(v: PromptVerdict, pc: PromptComparison, stop: str | None) -> PromptVerdict:
    """A diverged prompt that passed, whose candidate then stopped early on an id not known to
    end a sequence: what it did not generate is unjudged, so it is unverified, never a pass."""
    if not v.passed or stop is None or v.rule not in (Policy.NEAR_TIE, Policy.NEAR_TIE_REFERENCE_ONLY) \
            or pc.status not in (Status.NEAR_TIE, Status.DIVERGENT):
        return v
    return replace(v, passed=False, unverified=True, reason=f"unverified: {v.reason}; {stop}")


def _require_samples(comparison: Comparison, reference: Mapping[str, Record]) -> None:
    """Policy distributional compares with the reference's K samples: without them it is bad input."""
    lacking = [p.id for p in comparison.prompts if reference.get(p.id) is not None and reference[p.id].samples is None]
    if lacking:
        raise ConfigError(
            f"policy 'distributional' needs the reference's samples, and {len(lacking)} prompt(s) have none "
            f"(first: {lacking[0]!r}); capture a baseline with `strict-gate capture --runs K` or pick "
            "another policy"
        )


def _rule(policy: Policy, rec: Record | None) -> Policy:
    """The rule one prompt is judged by: auto is distributional where the reference disagrees
    with itself across its samples, strict elsewhere."""
    if policy != Policy.AUTO:
        return policy
    return Policy.DISTRIBUTIONAL if _samples_agree(rec) is False else Policy.STRICT


def _prompt_verdict(pc: PromptComparison, rule: Policy, reference: Mapping[str, Record],
                    candidate: Mapping[str, Record], later: Cascade | None, dg: Diagnosis | None,
                    band: float) -> PromptVerdict:
    if pc.status in UNCOMPARED:
        return PromptVerdict(pc.id, False, rule, f"{pc.status}: {pc.detail}")
    if pc.status == Status.TOKENIZATION_MISMATCH:
        return PromptVerdict(pc.id, False, rule, f"tokenization mismatch: {pc.detail}")
    if pc.status == Status.NOT_GREEDY:  # fails every policy: the arm did not decode greedily
        return PromptVerdict(pc.id, False, rule, f"not greedy: {pc.detail}")
    if rule == Policy.DISTRIBUTIONAL:
        return _distributional(pc, rule, reference[pc.id], candidate[pc.id])
    if pc.status == Status.MATCH:
        loose = strict_problem(reference[pc.id], candidate[pc.id]) if rule == Policy.STRICT else None
        if loose is not None:
            return PromptVerdict(pc.id, False, rule, loose)
        return PromptVerdict(pc.id, True, rule, f"exact match ({pc.detail})" if pc.detail else "exact match")
    if rule == Policy.NEAR_TIE_REFERENCE_ONLY and pc.status in (Status.DIVERGENT, Status.NEAR_TIE):
        passed, why = reference_only(pc, dg, band)
        return PromptVerdict(pc.id, passed, rule, why)
    return _diverged(pc, rule, later)


def _distributional(pc: PromptComparison, rule: Policy, ref: Record, cand: Record) -> PromptVerdict:
    """The candidate's tokens equal one of the reference's K captured samples, or they fail."""
    hit = next((k for k, s in enumerate(ref.samples or ()) if s == cand.token_ids), None)
    if hit is None:
        return PromptVerdict(pc.id, False, rule, f"equals none of the reference's {len(ref.samples or ())} samples")
    return PromptVerdict(pc.id, True, rule, f"equals reference sample {hit}")


def _diverged(pc: PromptComparison, rule: Policy, later: Cascade | None) -> PromptVerdict:
    """A prompt whose tokens differ: it passes only as a near-tie under policy near-tie."""
    d = pc.first_divergence
    if pc.status == Status.NEAR_TIE and rule == Policy.NEAR_TIE:
        assert d is not None  # a near-tie has its divergence
        return _near_tie(pc, rule, f"near-tie at position {d.position}: {d.reason}", later)
    where = f" at position {d.position}" if d else ""
    why = f": {d.reason}" if d else ""
    extra = " (a near-tie fails under strict)" if pc.status == Status.NEAR_TIE else ""
    return PromptVerdict(pc.id, False, rule, f"{pc.status}{where}{why}{extra}")


def _near_tie(pc: PromptComparison, rule: Policy, head: str, later: Cascade | None) -> PromptVerdict:
    """A first divergence that is a near-tie passes only when every later position follows or is
    a further near-tie; one that could not be judged leaves the prompt unverified."""
    d = pc.first_divergence
    assert d is not None
    end = pc.candidate_length
    if later is None and end > d.position + 1:
        span = f"position {d.position + 1}" if end == d.position + 2 else f"positions {d.position + 1}-{end - 1}"
        return PromptVerdict(pc.id, False, rule, f"unverified: {head}; {span} after the flip not judged: {UNJUDGED}",
                             unverified=True)
    if later is None:
        return PromptVerdict(pc.id, True, rule, f"{head}; no position after it")
    outcome = later.outcome
    if outcome == Later.DIVERGENT:
        p = later.divergent[0]
        return PromptVerdict(pc.id, False, rule, f"divergent after a near-tie: later position {p.position}, token "
                             f"{p.token} vs the reference's argmax {p.reference_argmax}: {p.reason} ({head}; "
                             f"{later.counts()})")
    if outcome == Later.UNVERIFIED:
        return PromptVerdict(pc.id, False, rule, f"unverified: {head}; {later.summary()}", unverified=True)
    return PromptVerdict(pc.id, True, rule, f"{head}; {later.summary()}")


def _auto_notes(comparison: Comparison, verdicts: tuple[PromptVerdict, ...],
                reference: Mapping[str, Record]) -> tuple[str, ...]:
    """What policy auto could not measure (prompts without samples) and where it went distributional."""
    notes: list[str] = []
    unsampled = sum(1 for pc in comparison.prompts if _samples_agree(reference.get(pc.id)) is None)
    if unsampled == len(comparison.prompts) and comparison.prompts:
        notes.append("auto: the reference has no repeated samples, so its determinism is unmeasured; strict applied")
    elif unsampled:
        notes.append(f"auto: {unsampled} prompt(s) without reference samples were judged strictly")
    nd = sum(1 for v in verdicts if v.rule == Policy.DISTRIBUTIONAL)
    if nd:
        notes.append(f"auto: {nd} prompt(s) where the reference disagrees with itself were judged distributionally")
    return tuple(notes)


def _outcome(comparison: Comparison, verdicts: tuple[PromptVerdict, ...], policy: Policy,
             run_problems: tuple[str, ...]) -> tuple[VerdictKind, tuple[str, ...]]:
    """The gate's verdict and why, most important first. Never a pass with an arm's problem,
    a prompt not compared, zero prompts or zero positions."""
    s = comparison.summary
    uncompared = [pc for pc in comparison.prompts if pc.status in UNCOMPARED]
    skipped = {pc.id for pc in uncompared}
    unverified = [v for v in verdicts if v.unverified and v.id not in skipped]
    failing = [v for v in verdicts if not v.passed and not v.unverified and v.id not in skipped]
    named = [f"{v.id}: {v.reason}" for v in failing[:NAMED]]
    not_compared = f"{len(uncompared)} of {s.prompts_total} prompt(s) were not compared"
    if run_problems:
        return VerdictKind.INCOMPLETE, (*run_problems, not_compared, *named)
    if failing:
        more = [f"... and {len(failing) - NAMED} more"] if len(failing) > NAMED else []
        also = [f"also {len(uncompared)} prompt(s) not compared (missing or errored)"] if uncompared else []
        also += [f"also {len(unverified)} prompt(s) unverified after a near-tie"] if unverified else []
        head = f"{len(failing)} of {s.prompts_total} prompt(s) fail policy {policy.value!r}"
        return VerdictKind.FAIL, (head, *named, *more, *also)
    if s.prompts_total == 0:
        return VerdictKind.INCOMPLETE, ("zero prompts were compared: an empty gate proves nothing",)
    if uncompared:
        return VerdictKind.INCOMPLETE, (not_compared, *(f"{pc.id}: {pc.status}: {pc.detail}" for pc in uncompared[:NAMED]))
    if unverified:
        head = (f"{len(unverified)} of {s.prompts_total} prompt(s) unverified: a near-tie whose later positions "
                "could not all be judged is never a pass")
        return VerdictKind.INCOMPLETE, (head, *(f"{v.id}: {v.reason}" for v in unverified[:NAMED]))
    if s.positions_total == 0:
        return VerdictKind.INCOMPLETE, (
            "zero token positions were compared (every record is empty): an empty gate proves nothing",)
    return VerdictKind.PASS, (f"all {s.prompts_total} prompts pass policy {policy.value!r}",)
