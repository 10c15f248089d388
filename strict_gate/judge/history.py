"""Night-to-night history: one JSON line per gate in `<output_dir>/history.jsonl`.

A nightly job keeps its output directory (a CI cache or artifact) and each gate appends one
line, so a report can show the trend without re-reading old reports. One line is written with
one `write()` on a file opened for appending and flushed, so concurrent or killed writers leave
at worst a torn last line, which reading skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

HISTORY_FILE = "history.jsonl"
HISTORY_SCHEMA = "strict-gate/history@1"
DEFAULT_NIGHTS = 14
DRIFT_TOTALS = ("same_top1_rate", "abs_dlogprob", "kl", "min_reference_margin", "positions_within_band", "positions")


def drift_totals(report: dict) -> dict | None:
    """The drift totals of a report.json, when it has a drift object (totals at its top level
    or under "totals"); per-prompt figures are left out."""
    drift = report.get("drift")
    if not isinstance(drift, dict):
        return None
    src = drift.get("totals") if isinstance(drift.get("totals"), dict) else drift
    return {k: src[k] for k in DRIFT_TOTALS if k in src}


def _arm(info: dict) -> dict:
    opts = info.get("options") or {}
    arm = {"kind": info.get("kind"), "model": info.get("model"), "versions": info.get("versions") or {}}
    if "replayed_from" in opts:
        arm["baseline"] = opts["replayed_from"]
    return arm


def git_commit(folder: str | Path | None) -> str | None:
    """`git rev-parse HEAD` in the config's folder; None when that is not a git checkout."""
    if folder is None:
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def entry_from_report(report: dict, report_dir: str | Path | None = None) -> dict[str, Any]:
    """One night's line, from a report.json as written (so old reports can be replayed into it)."""
    s = report.get("summary") or {}
    engines = report.get("engines") or {}
    config = report.get("config") or {}
    entry: dict[str, Any] = {
        "schema": HISTORY_SCHEMA,
        "time": report.get("created"),
        "gate": report.get("name"),
        "verdict": report.get("verdict"),
        "prompts": {"exact": s.get("prompts_exact"), "total": s.get("prompts_total")},
        "positions": {"matched": s.get("positions_matched"), "total": s.get("positions_total")},
        "counts": dict(s.get("counts") or {}),
        "reference": _arm(engines.get("reference") or {}),
        "candidate": _arm(engines.get("candidate") or {}),
        "prompt_set_sha256": (report.get("prompt_set") or {}).get("sha256"),
        "commit": git_commit(config.get("base_dir")),
        "report_dir": None if report_dir is None else Path(report_dir).name,  # beside history.jsonl
    }
    drift = drift_totals(report)
    if drift is not None:
        entry["drift"] = drift
    return entry


def append_history(output_dir: str | Path, entry: dict) -> Path:
    """Append one line to output_dir/history.jsonl: one write, flushed and synced; returns the file."""
    path = Path(output_dir) / HISTORY_FILE
    line = (json.dumps(entry, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line must not swallow this one
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_history(output_dir: str | Path, n: int = DEFAULT_NIGHTS, *, gate: str | None = None) -> tuple[dict, ...]:
    """The last n entries (of one gate when named), oldest first; unreadable lines are skipped."""
    path = Path(output_dir) / HISTORY_FILE
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return ()
    entries = []
    for raw in lines:
        try:
            e = json.loads(raw)
        except ValueError:  # a torn line (a writer killed mid-write) or junk
            continue
        if isinstance(e, dict) and (gate is None or e.get("gate") == gate):
            entries.append(e)
    return tuple(entries[-n:]) if n > 0 else ()


def with_history(result, report_dir: Path, n: int = DEFAULT_NIGHTS):
    """(the result carrying its trend, tonight's entry): this gate's earlier nights in the
    output directory (report_dir's parent), then tonight."""
    from dataclasses import replace

    from strict_gate.core.redact import scrub_obj
    from strict_gate.judge.result import to_json

    entry = scrub_obj(entry_from_report(to_json(result), report_dir))
    earlier = read_history(Path(report_dir).parent, n - 1, gate=result.name)
    return replace(result, history=earlier + (entry,)), entry
