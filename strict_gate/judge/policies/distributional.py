"""Policy distributional: the candidate's tokens equal one of the reference's K captured samples.

It accepts a divergence only as an exact copy of a sample, so no token after a flip passes
unjudged. Without the samples there is nothing to judge by: bad input, not a fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strict_gate.errors import ConfigError
from strict_gate.judge.compare import Comparison
from strict_gate.judge.policies.rule import Case, Rule, Ruling
from strict_gate.runs.records import Record


@dataclass(frozen=True)
class Distributional(Rule):
    def judge(self, case: Case) -> Ruling:
        samples = case.reference.samples or ()
        hit = next((k for k, s in enumerate(samples) if s == case.candidate.token_ids), None)
        if hit is None:
            return Ruling(False, f"equals none of the reference's {len(samples)} samples")
        return Ruling(True, f"equals reference sample {hit}")

    def check(self, comparison: Comparison, reference: Mapping[str, Record]) -> None:
        lacking = [p.id for p in comparison.prompts if reference.get(p.id) is not None and reference[p.id].samples is None]
        if lacking:
            raise ConfigError(
                f"policy 'distributional' needs the reference's samples, and {len(lacking)} prompt(s) have none "
                f"(first: {lacking[0]!r}); capture a baseline with `strict-gate capture --runs K` or pick "
                "another policy"
            )


RULE = Distributional("distributional", "the candidate equals one of the reference's K captured samples")
