"""What a policy is: one small rule object (judge/policies/__init__.py maps each name to one).

judge/policy.py assembles the verdict: it fails what no rule can pass (a prompt not compared,
not tokenised alike, not decoded greedily) and hands every other compared prompt to the rule,
so a rule holds only what is its own: how it judges one prompt, what input it refuses, the notes
and the caveat every report carries with its name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from strict_gate.judge.cascade import Cascade
from strict_gate.judge.compare import Comparison, PromptComparison
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.runs.records import Record


@dataclass(frozen=True)
class Case:
    """What a rule may read of one compared prompt; each rule takes the part it needs."""

    prompt: PromptComparison
    reference: Record
    candidate: Record
    band: float
    later: Cascade | None = None  # its later positions judged, both sides (cross_check)
    diagnosis: Diagnosis | None = None  # the reference's re-scoring of the candidate's tokens


@dataclass(frozen=True)
class Ruling:
    """One prompt as a rule judged it; judge/policy.py's PromptVerdict records it."""

    passed: bool
    reason: str
    unverified: bool = False  # not passed because part of it could not be judged (counted as incomplete)


@dataclass(frozen=True)
class Rule(ABC):
    """A policy. `name` is how configs, the CLI and reports spell it; `doc` its one line (the
    CLI's --policy help); `caveat` the words every report adds to the name where the rule's
    pass is a weaker claim; `judges_later`: it passes a flip on the judgement of the positions
    after it, so a candidate's unjudged early stop leaves such a prompt unverified."""

    name: str
    doc: str
    one_sided: bool = False  # judged from the reference's side alone
    caveat: str | None = None
    judges_later: bool = False

    @property
    def words(self) -> str:
        """The policy as a verdict line names it: a caveat follows the name."""
        return f"{self.name} ({self.caveat})" if self.caveat else self.name

    @abstractmethod
    def judge(self, case: Case) -> Ruling:
        """One compared prompt: passes, fails or is unverified, and why."""

    def for_prompt(self, reference: Record | None) -> Rule:
        """The rule that judges one prompt and names it in its verdict (auto picks one)."""
        return self

    def check(self, comparison: Comparison, reference: Mapping[str, Record]) -> None:
        """Refuse, as bad input (ConfigError), what this rule cannot judge at all."""

    def notes(self, comparison: Comparison, reference: Mapping[str, Record]) -> tuple[str, ...]:
        """What the verdict says besides its reasons: by default the caveat."""
        return (f"policy {self.name}: {self.caveat}",) if self.caveat else ()

    def diagnoses(self, comparison: Comparison, diagnoses: Mapping[str, Diagnosis]) -> dict[str, Diagnosis]:
        """The diagnoses as every report shows them under this rule: by default as judged."""
        return dict(diagnoses)


def exact(pc: PromptComparison) -> Ruling:
    return Ruling(True, f"exact match ({pc.detail})" if pc.detail else "exact match")


def diverged(pc: PromptComparison, extra: str = "") -> Ruling:
    """A prompt whose tokens differ, failing the rule, with where and why."""
    d = pc.first_divergence
    where = f" at position {d.position}" if d else ""
    why = f": {d.reason}" if d else ""
    return Ruling(False, f"{pc.status}{where}{why}{extra}")
