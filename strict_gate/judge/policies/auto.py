"""Policy auto: strict where the reference's samples agree (or none were captured),
distributional where the reference itself disagrees across its runs.

Each prompt's verdict names the rule that judged it (strict or distributional), and the
verdict's notes say what auto could not measure and where it went distributional.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strict_gate.judge.compare import Comparison
from strict_gate.judge.policies import distributional, strict
from strict_gate.judge.policies.rule import Case, Rule, Ruling
from strict_gate.runs.records import Record


def samples_agree(rec: Record | None) -> bool | None:
    """True/False when the reference captured K>1 runs; None when it did not."""
    if rec is None or rec.samples is None or len(rec.samples) < 2:
        return None
    return all(s == rec.samples[0] for s in rec.samples[1:])


@dataclass(frozen=True)
class Auto(Rule):
    def for_prompt(self, reference: Record | None) -> Rule:
        return distributional.RULE if samples_agree(reference) is False else strict.RULE

    def judge(self, case: Case) -> Ruling:
        return self.for_prompt(case.reference).judge(case)

    def notes(self, comparison: Comparison, reference: Mapping[str, Record]) -> tuple[str, ...]:
        notes: list[str] = []
        agree = [samples_agree(reference.get(pc.id)) for pc in comparison.prompts]
        unsampled = agree.count(None)
        if unsampled == len(comparison.prompts) and comparison.prompts:
            notes.append("auto: the reference has no repeated samples, so its determinism is unmeasured; strict applied")
        elif unsampled:
            notes.append(f"auto: {unsampled} prompt(s) without reference samples were judged strictly")
        nd = agree.count(False)
        if nd:
            notes.append(f"auto: {nd} prompt(s) where the reference disagrees with itself were judged distributionally")
        return tuple(notes)


RULE = Auto("auto", "strict where the reference's K runs agree, distributional where it disagrees with itself")
