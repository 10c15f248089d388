"""A run's seal: a running hash over its record lines, keyed by the gate that wrote it.

`records.seal` holds one hex digest per line of records.jsonl: digest i hashes digest i-1
(the gate's key for the first) with line i, bytes as written. A resume recomputes the
chain, so a line edited, reordered, or copied from another run (whose chain starts from
another key) is refused. The key is stored in gate-state.json: this catches files mixed up
or edited by hand, not a forger who reads the key.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from strict_gate.errors import InputError


def next_seal(prev: str, line: bytes) -> str:
    """The seal after `line` (one record line, its newline included)."""
    return hashlib.sha256(prev.encode("ascii") + b"\n" + line).hexdigest()


def record_lines(path: Path) -> list[bytes]:
    """The complete lines of a records file (a torn tail without its newline is not one)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data.splitlines(keepends=True)[: data.count(b"\n")] if data else []


def check_seal(records: Path, seal: Path, key: str, *, whole: bool) -> int:
    """How many leading lines of `records` the seal covers, each checked; refuses a line
    whose digest differs, a seal longer than the file, and with `whole` an unsealed line."""
    lines = record_lines(records)
    seals = seal.read_text(encoding="ascii").split() if seal.exists() else []
    if len(seals) > len(lines):
        raise InputError(f"the seal covers {len(seals)} records, the file holds {len(lines)}: records were removed; "
                         "start a new gate", path=str(records))
    prev = key
    for i, (line, want) in enumerate(zip(lines, seals), start=1):
        prev = next_seal(prev, line)
        if prev != want:
            raise InputError("this record does not match the gate's seal (edited, or copied from another run); "
                             "start a new gate", path=str(records), line=i)
    if whole and len(seals) < len(lines):
        raise InputError("this record of a finished run is not sealed (added after the run closed); start a new gate",
                         path=str(records), line=len(seals) + 1)
    return len(seals)
