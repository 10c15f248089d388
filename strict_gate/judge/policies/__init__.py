"""The policies: the one mapping from a policy's name to its rule (judge/policies/rule.py).

A new policy is one file here (a Rule subclass and its RULE), its entry in RULES, and its
paragraph in docs/reading-a-report.md: the config key, the CLI's --policy, judge/policy.py's
Policy and every report take it from here.
"""

from __future__ import annotations

from collections.abc import Mapping

from strict_gate.errors import ConfigError
from strict_gate.judge.policies import auto, distributional, near_tie, near_tie_reference_only, strict
from strict_gate.judge.policies.rule import Rule

RULES: Mapping[str, Rule] = {rule.name: rule for rule in (
    strict.RULE, near_tie.RULE, distributional.RULE, auto.RULE, near_tie_reference_only.RULE)}
POLICIES = tuple(RULES)


def rule_of(name: str) -> Rule:
    """The rule a policy's name names; an unknown name is bad input (exit 2)."""
    rule = RULES.get(name)
    if rule is None:
        raise ConfigError(f"unknown policy {name!r}; choose one of: {', '.join(RULES)}")
    return rule
