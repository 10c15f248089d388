"""Night-to-night history: one JSON line per gate in `<output_dir>/history.jsonl`.

A nightly job keeps its output directory (a CI cache or artifact) and each gate appends one
line, so a report can show the trend without re-reading old reports. One line is written with
one `write()` on a file opened for appending, under an exclusive lock, and synced, so a killed
writer leaves at worst a torn last line, which reading skips.

Reading trusts nothing: each line is checked as a history@1 line (stored.HistoryLine); a line
of another version, torn or garbage is skipped with a note naming file:line, and a history
path that is a directory or a FIFO is an InputError (exit 2), never a hang. The file stays
bounded: reads scan back from the end, and an append keeps the newest HISTORY_MAX_LINES lines
within the last HISTORY_MAX_BYTES.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from strict_gate.core.files import new_temp_file
from strict_gate.errors import InputError
from strict_gate.judge.schema import DriftDoc, EngineDoc, ReportDoc
from strict_gate.judge.stored import HISTORY_SCHEMA, history_line, open_regular

HISTORY_FILE = "history.jsonl"
DEFAULT_NIGHTS = 14
HISTORY_MAX_LINES = 1000  # kept by every append, and the most a read scans
HISTORY_MAX_BYTES = 8 << 20  # of the file's end: a read never looks further back, a prune keeps no more
BLOCK = 64 << 10  # bytes per backward read
NOTES_SHOWN = 3  # skipped lines named one by one; the rest are counted


@dataclass(frozen=True)
class History:
    entries: tuple[dict, ...]  # oldest first
    notes: tuple[str, ...] = ()  # the lines skipped, as file:line: why


def _finite(obj: Any) -> Any:
    """Non-finite numbers as null: a drift score of -1e308 is valid and its totals overflow."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def drift_totals(drift: DriftDoc | None) -> dict | None:
    """A report's drift totals as a history line holds them (per-prompt figures left out)."""
    if drift is None:
        return None
    d = msgspec.to_builtins(drift)
    keep = ("same_top1_rate", "abs_dlogprob", "kl", "min_reference_margin", "positions_within_band", "positions")
    return _finite({k: d[k] for k in keep if k in d})


def _arm(info: EngineDoc) -> dict:
    arm = {"kind": info.kind, "model": info.model, "versions": dict(info.versions)}
    if info.known.replayed_from is not None:
        arm["baseline"] = info.known.replayed_from
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


def entry_from_report(report: ReportDoc, report_dir: str | Path | None = None) -> dict[str, Any]:
    """One night's line, from a report (so old reports can be replayed into it)."""
    s = report.summary
    entry: dict[str, Any] = {
        "schema": HISTORY_SCHEMA,
        "time": report.created,
        "gate": report.name,
        "verdict": None if report.verdict is None else report.verdict.value,
        "prompts": {"exact": s.prompts_exact, "total": s.prompts_total},
        "positions": {"matched": s.positions_matched, "total": s.positions_total},
        "counts": {str(k): v for k, v in s.counts.items()},
        "reference": _arm(report.engines.reference),
        "candidate": _arm(report.engines.candidate),
        "prompt_set_sha256": report.prompt_set.sha256 if report.prompt_set else None,
        "commit": git_commit(report.config.base_dir if report.config else None),
        "report_dir": None if report_dir is None else Path(report_dir).name,  # beside history.jsonl
    }
    drift = drift_totals(report.drift)
    if drift is not None:
        entry["drift"] = drift
    return entry


def _lines_backwards(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of the non-blank lines of the file's last HISTORY_MAX_BYTES, last line
    first, read BLOCK bytes at a time; a line that starts before that window is not one."""
    floor = max(0, size - HISTORY_MAX_BYTES)
    pos, buf = size, b""  # buf: the file's bytes from pos up to the lines already given
    while True:
        hi = len(buf)
        cut = buf.rfind(b"\n", 0, hi)
        while cut >= 0:
            if buf[cut + 1 : hi].strip():
                yield pos + cut + 1, buf[cut + 1 : hi]
            hi, cut = cut, buf.rfind(b"\n", 0, cut)
        buf = buf[:hi]
        if pos <= floor:
            break
        start = max(floor, pos - BLOCK)
        buf = os.pread(fd, pos - start, start) + buf
        pos = start
    if pos == 0 and buf.strip():
        yield 0, buf


def _where(path: Path, fd: int, offset: int) -> str:
    """`path:line` of the line at byte `offset`, its lines counted only for a note; past
    HISTORY_MAX_BYTES (a file from before the bound) the byte offset instead."""
    if offset > HISTORY_MAX_BYTES:
        return f"{path} (the line at byte {offset})"
    line = os.pread(fd, offset, 0).count(b"\n") + 1
    return f"{path}:{line}"


def _parse(raw: bytes) -> tuple[dict | None, str | None]:
    """(the line's object, None), or (None, why it is not a line this version reads)."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        return None, f"not JSON ({e}; a writer killed mid-line leaves one)"
    why = history_line(obj)
    return (obj, None) if why is None else (None, why)


def _notes(path: Path, fd: int, skipped: list[tuple[int, str]]) -> tuple[str, ...]:
    shown = [f"{_where(path, fd, off)}: history line skipped: {why[:200]}" for off, why in skipped[:NOTES_SHOWN]]
    more = len(skipped) - NOTES_SHOWN
    return tuple(shown) + ((f"{path}: {more} more history lines skipped",) if more > 0 else ())


def load_history(output_dir: str | Path, n: int = DEFAULT_NIGHTS, *, gate: str | None = None) -> History:
    """The last n readable entries (of one gate when named), oldest first, and a note per
    skipped line. No history file: none. Not a regular file: InputError."""
    path = Path(output_dir) / HISTORY_FILE
    if n <= 0:
        return History(())
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return History(())
    try:
        entries: list[dict] = []
        skipped: list[tuple[int, str]] = []
        for scanned, (offset, raw) in enumerate(_lines_backwards(fd, os.fstat(fd).st_size)):
            if scanned >= HISTORY_MAX_LINES or len(entries) >= n:
                break
            entry, why = _parse(raw)
            if entry is None:
                skipped.append((offset, str(why)))
            elif gate is None or entry.get("gate") == gate:
                entries.append(entry)
        return History(tuple(reversed(entries)), _notes(path, fd, skipped[::-1]))
    finally:
        os.close(fd)


def read_history(output_dir: str | Path, n: int = DEFAULT_NIGHTS, *, gate: str | None = None) -> tuple[dict, ...]:
    """The last n readable entries (of one gate when named), oldest first."""
    return load_history(output_dir, n, gate=gate).entries


def _locked(path: Path) -> int:
    """history.jsonl open for appending under an exclusive lock, the file at `path` now (a
    prune may have replaced it while this writer waited for the lock)."""
    while True:
        fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        st = os.fstat(fd)
        if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
            return fd
        os.close(fd)


def _prune(fd: int, path: Path) -> None:
    """Keep the newest HISTORY_MAX_LINES lines of the last HISTORY_MAX_BYTES: replace the file
    when anything lies before them. Called under the lock."""
    kept: list[tuple[int, bytes]] = []
    for offset, raw in _lines_backwards(fd, os.fstat(fd).st_size):
        if len(kept) == HISTORY_MAX_LINES:
            break
        kept.append((offset, raw))
    if not kept or kept[-1][0] == 0:
        return
    tmp_fd, tmp = new_temp_file(path.parent, f".{path.name}.")
    try:
        with open(tmp_fd, "wb") as f:
            f.write(b"".join(raw + b"\n" for _, raw in reversed(kept)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_history(output_dir: str | Path, entry: dict) -> Path:
    """Append one line to output_dir/history.jsonl (one write, synced, then pruned to the bound);
    returns the file. Not a regular file, or not writable: InputError naming it."""
    path = Path(output_dir) / HISTORY_FILE
    record = _finite({"schema": HISTORY_SCHEMA} | entry)
    line = (json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")
    try:
        fd = _locked(path)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line must not swallow this one
                line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
            _prune(fd, path)
        finally:
            os.close(fd)
    except OSError as e:
        raise InputError(f"cannot append to the history: {e.strerror or e}", path=str(path)) from None
    return path


def with_history(result, report_dir: Path, n: int = DEFAULT_NIGHTS):
    """(the result carrying its trend, tonight's entry): this gate's earlier nights in the
    output directory (report_dir's parent), then tonight. A history that cannot be read is a
    note here; the append after the reports are written refuses it (exit 2)."""
    from dataclasses import replace

    from strict_gate.core.redact import scrub_obj
    from strict_gate.judge.result import to_json
    from strict_gate.judge.stored import report_of

    entry = scrub_obj(entry_from_report(report_of(to_json(result)), report_dir))
    try:
        past = load_history(Path(report_dir).parent, n - 1, gate=result.name)
    except InputError as e:
        past = History((), (f"no trend: the history cannot be read ({e})",))
    return replace(result, history=past.entries + (entry,), notes=result.notes + past.notes), entry
