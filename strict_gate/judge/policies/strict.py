"""Policy strict: every prompt matches token for token.

A text-only server's equal text is not enough where it re-tokenises to other ids or its usage
counts others (judge/text_only.py's strict_problem).
"""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.judge.compare import Status
from strict_gate.judge.policies.rule import Case, Rule, Ruling, diverged, exact
from strict_gate.judge.text_only import strict_problem


@dataclass(frozen=True)
class Strict(Rule):
    def judge(self, case: Case) -> Ruling:
        pc = case.prompt
        if pc.status == Status.MATCH:
            loose = strict_problem(case.reference, case.candidate)
            return exact(pc) if loose is None else Ruling(False, loose)
        return diverged(pc, " (a near-tie fails under strict)" if pc.status == Status.NEAR_TIE else "")


RULE = Strict("strict", "every token equal")
