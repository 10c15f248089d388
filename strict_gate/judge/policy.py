"""The verdict of a gate under its policy. The policy is explicit in every report and cannot
pass vacuously.

Each policy is a rule object in judge/policies/ (strict, near-tie, distributional, auto,
near-tie-reference-only; docs/reading-a-report.md says what each accepts), named in one mapping.
Here every prompt gets its verdict: what no rule can pass fails here (a prompt not compared, not
tokenised alike, not decoded greedily), every other prompt is the rule's to judge; then the
gate's verdict and why. Only near-tie accepts a near-tie (and, one-sided and weaker,
near-tie-reference-only); auto and distributional accept a divergence only as an exact copy of
a reference sample, so no rule passes a token after a flip unjudged. A passed flip whose
candidate stopped early (finish "stop", fewer than max_tokens tokens) on an id not known to end
a sequence (cascade.stop_problem) is unverified: the positions it never generated are not
judged. An unverified prompt is never a pass: it counts with the incomplete verdicts (exit 3)
unless another prompt fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from strict_gate.errors import ExitCode
from strict_gate.judge.cascade import Cascade
from strict_gate.judge.compare import UNCOMPARED, Comparison, PromptComparison, Status
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.judge.policies import RULES, Rule, rule_of
from strict_gate.judge.policies.rule import Case
from strict_gate.runs.records import Record

# The policy a gate is judged by, as configs, the CLI and reports spell it: one member per rule
# of the mapping (NEAR_TIE for "near-tie"), so a new rule needs no line here.
Policy = StrEnum("Policy", [(name.upper().replace("-", "_"), name) for name in RULES])  # type: ignore[misc]
DEFAULT_POLICY = Policy("auto")


class VerdictKind(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"


NAMED = 20  # failing (or uncompared) prompts named in a verdict's reasons


@dataclass(frozen=True)
class PromptVerdict:
    id: str
    passed: bool
    rule: Policy  # the rule applied to this prompt: strict | near-tie | distributional | ...
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
    def rule(self) -> Rule:
        return RULES[self.policy]

    @property
    def policy_words(self) -> str:
        """The policy as a verdict line names it: a one-sided policy says that it is one."""
        return self.rule.words

    @property
    def exit_code(self) -> ExitCode:
        return {VerdictKind.PASS: ExitCode.PASS, VerdictKind.FAIL: ExitCode.FAIL}.get(
            self.verdict, ExitCode.ENGINE_FAILURE)


def check_policy(policy: Policy | str) -> Policy:
    """A policy's name read from outside (a config, the command line, a state file), checked
    against the mapping; past this point the Policy is passed on, not checked again."""
    return Policy(rule_of(policy).name)


def policy_words(policy: str | None) -> str:
    """A stored report's policy as a verdict line names it; a name this version does not know
    is shown as written."""
    rule = RULES.get(policy) if policy is not None else None
    return rule.words if rule is not None else str(policy)


def apply_policy(
    comparison: Comparison,
    policy: Rule | Policy | str,
    reference: Mapping[str, Record],
    candidate: Mapping[str, Record],
    *,
    run_problems: tuple[str, ...] = (),
    later: Mapping[str, Cascade] | None = None,
    diagnoses: Mapping[str, Diagnosis] | None = None,
    stops: Mapping[str, str] | None = None,
) -> Verdict:
    """Judge a comparison by a rule (a gate hands its spec's; a name is looked up in the mapping).
    run_problems (an arm that failed or stopped early) force incomplete: a gate whose engine died
    is an engine failure (exit 3) even where the prompts done diverge. `later`: each diverged
    prompt's later positions judged (cross_check); a near-tie without one, with positions after
    its flip, is unverified. `diagnoses` (the reference's re-scoring) is what policy
    near-tie-reference-only judges by. `stops`: why a prompt's early stop is not judged
    (cascade.stop_problem); a passed flip with one is unverified."""
    rule = policy if isinstance(policy, Rule) else rule_of(policy)
    rule.check(comparison, reference)
    later, stops, diagnoses = later or {}, stops or {}, diagnoses or {}
    verdicts = tuple(_prompt_verdict(pc, rule.for_prompt(reference.get(pc.id)), reference, candidate,
                                     later.get(pc.id), diagnoses.get(pc.id), stops.get(pc.id), comparison.band)
                     for pc in comparison.prompts)
    verdict, reasons = _outcome(comparison, verdicts, rule, run_problems)
    return Verdict(verdict, Policy(rule.name), comparison.band, verdicts, reasons, rule.notes(comparison, reference))


def _prompt_verdict(pc: PromptComparison, rule: Rule, reference: Mapping[str, Record],
                    candidate: Mapping[str, Record], later: Cascade | None, dg: Diagnosis | None,
                    stop: str | None, band: float) -> PromptVerdict:
    """One prompt's verdict: what fails every rule fails here, the rule judges the rest. A flip
    the rule passed, whose candidate then stopped early on an id not known to end a sequence:
    what it did not generate is unjudged, so it is unverified, never a pass."""
    name = Policy(rule.name)
    if pc.status in UNCOMPARED:
        return PromptVerdict(pc.id, False, name, f"{pc.status}: {pc.detail}")
    if pc.status == Status.TOKENIZATION_MISMATCH:
        return PromptVerdict(pc.id, False, name, f"tokenization mismatch: {pc.detail}")
    if pc.status == Status.NOT_GREEDY:  # fails every policy: the arm did not decode greedily
        return PromptVerdict(pc.id, False, name, f"not greedy: {pc.detail}")
    r = rule.judge(Case(pc, reference[pc.id], candidate[pc.id], band, later, dg))
    if r.passed and stop is not None and rule.judges_later and pc.status in (Status.NEAR_TIE, Status.DIVERGENT):
        return PromptVerdict(pc.id, False, name, f"unverified: {r.reason}; {stop}", unverified=True)
    return PromptVerdict(pc.id, r.passed, name, r.reason, r.unverified)


def _outcome(comparison: Comparison, verdicts: tuple[PromptVerdict, ...], rule: Rule,
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
        head = f"{len(failing)} of {s.prompts_total} prompt(s) fail policy {rule.name!r}"
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
    return VerdictKind.PASS, (f"all {s.prompts_total} prompts pass policy {rule.name!r}",)
