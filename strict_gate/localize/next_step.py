"""The line a gate ends with: the next command that works on its report. A flip is localised
by `strict-gate localize REPORT_DIR --prompt ID` (without --prompt, localize takes the divergent
prompts alone, and a report of near-ties only is bad input), where the arms can dump
activations; else `strict-gate show REPORT_DIR --prompt ID` is the step (docs/localize.md)."""

from __future__ import annotations

import shlex
from pathlib import Path

from strict_gate.judge.compare import Status
from strict_gate.judge.result import GateResult
from strict_gate.localize.arm import later_divergence
from strict_gate.localize.config import Scope, cannot_localize

NOTHING_DIVERGENT = "nothing divergent to localise: every flip is a near-tie"


def next_step(cfg, result: GateResult, report_dir: Path | str) -> str | None:
    """The command to type next, with a prompt of this report, or None when no prompt flipped
    (divergent or near-tie): the first divergent prompt (a near-tie that diverges later is one,
    named with its later position), else the first near-tie."""
    flipped = [p for p in result.comparison.prompts
               if p.first_divergence is not None and p.status in Scope.ALL.statuses]
    if not flipped:
        return None
    later = {p.id: lp for p in flipped if (lp := later_divergence(p.status, result.later.get(p.id))) is not None}
    divergent = [p for p in flipped if p.status == Status.DIVERGENT or p.id in later]
    pid = (divergent or flipped)[0].id
    where, quoted = shlex.quote(str(report_dir)), shlex.quote(pid)
    head = "next: " if divergent else f"{NOTHING_DIVERGENT}; "
    if pid in later:
        quoted += f" (its near-tie diverges later, at position {later[pid].position})"
    if pid in result.localization:
        return f"{head}strict-gate show {where} --prompt {quoted} (its localisation, as the gate ran it)"
    why = cannot_localize(cfg, result.reference, result.candidate)
    if why is not None:
        return (f"{head}strict-gate show {where} --prompt {quoted} (both sides at the flip; localize cannot "
                f"run here: {why})")
    if divergent:
        return f"next: strict-gate localize {where} --prompt {quoted} (the first layer where it parts)"
    return f"{head}to see where one starts along the depth: strict-gate localize {where} --prompt {quoted}"
