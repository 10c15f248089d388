"""What a Ctrl-C (or SIGTERM, SIGHUP) left of a gate, in words: the phase it stopped in, the run in
flight and its records, the runs marked failed, and what `--resume` will keep, continue and run
again. Each planned run (the arms', each feature's `Feature.planned`) is read back from disk as a
resume would read it (gate/kept.py), a speculative variant's with its sealed acceptance counts
(gate/acceptance.py), so the message says what the resume will do, not a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from strict_gate.errors import GateInterrupted, StrictGateError
from strict_gate.gate.arm import finished_run
from strict_gate.gate.kept import Planned, Runs
from strict_gate.runs.records import Run, RunStatus


def interrupted(runs: Runs, planned: Sequence[Planned], command: str = "gate") -> GateInterrupted:
    """The interrupt of the gate (or `strict-gate invariance`) making `runs`, whose phases plan `planned`."""
    stored: dict[Path, Run | str | None] = {}
    for p in planned:
        try:
            stored[p.path] = runs.stored(p.path)
        except (StrictGateError, OSError) as e:  # what a resume would refuse, said here already
            stored[p.path] = f"refused by --resume: {e}"
    failed = tuple(str(p.path) for p in planned
                   if isinstance(r := stored[p.path], Run) and r.manifest.status == RunStatus.FAILED)
    where = _where(runs, planned, stored)
    return GateInterrupted(str(runs.report.path), failed, where, _plan(runs, planned, stored), command)


def _count(run: Run | str | None) -> int:
    return sum(1 for r in run.records.values() if r.error is None) if isinstance(run, Run) else 0


def _where(runs: Runs, planned: Sequence[Planned], stored: dict) -> str:
    """The phase, and the run it stopped in with its records (or the last run it had finished)."""
    w, total = runs.where, len(runs.ps)
    by_path = {p.path: p for p in planned}
    if w.run is not None and (p := by_path.get(w.run)) is not None:
        within = f" phase: {p.what}" if p.what else ""
        return f"the {p.phase}{within}, {_count(stored.get(w.run))} of {total} records done"
    if w.last is not None and (p := by_path.get(w.last)) is not None:
        return (f"the {w.phase} phase, between runs: {p.label} had finished ({_count(stored.get(w.last))} of "
                f"{total} records), the next had not begun")
    return f"the {w.phase} phase, before it started a run"


def _plan(runs: Runs, planned: Sequence[Planned], stored: dict) -> tuple[str, ...]:
    """One line each: the runs `--resume` keeps, continues, runs again, and runs for the first time."""
    total = len(runs.ps)
    keeps, continues, again, fresh = [], [], [], []
    for p in planned:
        run = stored[p.path]
        n = _count(run)
        if isinstance(run, str):
            again.append(f"{p.label} ({run})")
        elif run is None:
            fresh.append(p.label)
        elif finished_run(run, runs.ps.ids):
            counts = runs.kept_acceptance(p.path) if p.counted else None
            if isinstance(counts, str):  # what a resume reads of its counts, said here already
                again.append(f"{p.label} (from its first record: {counts})")
            else:
                keeps.append(f"{p.label} ({n} records{' and its sealed acceptance counts' if p.counted else ''})")
        elif p.continues and n:
            continues.append(f"{p.label} ({n} of {total} records kept, {total - n} to generate)")
        else:
            why = f": {p.restarts}" if n and p.restarts else ""
            again.append(f"{p.label} (from its first record{why})")
    lines = (("keeps", keeps), ("continues", continues), ("runs again", again), ("runs, not started yet", fresh))
    return tuple(f"--resume {verb}: {'; '.join(items)}" for verb, items in lines if items)
