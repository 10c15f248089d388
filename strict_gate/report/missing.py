"""Missing prompts in the human reports: one line per cause, not one row per prompt.

An arm that never started, or died early, leaves every remaining prompt without a record;
listing 128 identical "missing" rows buries the one line that matters. report.json keeps
every prompt; console, markdown and html list the other non-matching prompts row by row
and the missing ones as a count per cause with a few ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from strict_gate.judge.compare import PromptComparison, Status

SHOWN_IDS = 5


def listed(prompts: Iterable[PromptComparison]) -> list[PromptComparison]:
    """The non-matching prompts that get a row of their own (not match, not missing)."""
    return [p for p in prompts if p.status not in (Status.MATCH, Status.MISSING)]


def missing_lines(prompts: Iterable[PromptComparison]) -> list[str]:
    """One line per cause of missing records: how many, why, the first few ids."""
    groups: dict[str, list[str]] = {}
    for p in prompts:
        if p.status == Status.MISSING:
            groups.setdefault(p.detail, []).append(p.id)
    lines = []
    for detail, ids in groups.items():
        shown = ", ".join(ids[:SHOWN_IDS]) + (", …" if len(ids) > SHOWN_IDS else "")
        lines.append(f"{len(ids)} prompt(s) missing ({detail}): {shown}; every id is in report.json")
    return lines
