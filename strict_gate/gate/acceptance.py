"""A speculative variant's acceptance counts, sealed beside its finished run, so a resume can keep it.

The counts are the engine's counters read before and after the run: no record holds them, so
without this file a finished speculative run had to be made again (issue 54). It is written once
the run finished (temp file, fsync, rename: whole or absent), bound to the run by the last digest
of its records.seal (a chain over every record line from the run's own key), and digested, counts
included, with that key. A file that is truncated, of another schema, copied from another run,
left by an attempt whose run was made again, or whose counts were edited is refused, and the run
is made again: never trusted, never a traceback. Like the seal, the key is readable
(gate-state.json): this catches files mixed up or edited, not a forger.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

import msgspec

from strict_gate.engines.speculative import Acceptance
from strict_gate.runs.layout import RunDir
from strict_gate.runs.records import write_json_atomic

SCHEMA = "strict-gate/acceptance@1"
Count = Annotated[int, msgspec.Meta(ge=0)]


class _Counts(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    drafted: Count
    accepted: Count
    drafts: Count | None
    replies: Count
    replies_without: Count
    replies_drafting: Count


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: str
    run_seal: str  # the last digest of the run's records.seal: the run these counts belong to
    acceptance: _Counts | None  # None: the engine kept no counts over the run
    digest: str


def _counts(a: Acceptance | None) -> dict | None:
    return None if a is None else {"drafted": a.drafted, "accepted": a.accepted, "drafts": a.drafts,
                                   "replies": a.replies, "replies_without": a.replies_without,
                                   "replies_drafting": a.replies_drafting}


def _digest(key: str, run_seal: str, counts: dict | None) -> str:
    body = json.dumps({"schema": SCHEMA, "run_seal": run_seal, "acceptance": counts}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(f"{key}\n{body}".encode()).hexdigest()


def _run_seal(d: RunDir) -> str | None:
    """The last digest of the run's seal (None: no record sealed)."""
    try:
        seals = d.seal.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return None
    return seals[-1] if seals else None


def write_acceptance(d: RunDir, key: str, acceptance: Acceptance | None) -> None:
    """The counts of the finished, sealed run in `d` (`key`: its seal key), beside it."""
    last = _run_seal(d)
    if last is None:  # nothing sealed to bind the counts to: a resume makes the run again
        return
    counts = _counts(acceptance)
    write_json_atomic(d.acceptance, {"schema": SCHEMA, "run_seal": last, "acceptance": counts,
                                     "digest": _digest(key, last, counts)})


def read_acceptance(d: RunDir, key: str) -> Acceptance | str | None:
    """The counts sealed beside the finished run in `d` (None: its engine kept none), or, as a
    string, why they are not trusted (the run is then made again)."""
    name = d.acceptance.name
    if not d.acceptance.exists():
        return "its acceptance counts were never sealed beside it (stopped before they were written)"
    try:
        f = msgspec.json.decode(d.acceptance.read_bytes(), type=_File)
    except (OSError, msgspec.DecodeError) as e:  # a ValidationError is a DecodeError
        return f"its {name} is not trusted: unreadable ({e})"
    if f.schema != SCHEMA:
        return f"its {name} is not trusted: schema {f.schema!r}, not {SCHEMA!r}"
    if f.run_seal != _run_seal(d):
        return f"its {name} is not trusted: it belongs to another run (its records seal differs)"
    c = f.acceptance
    if f.digest != _digest(key, f.run_seal, None if c is None else msgspec.structs.asdict(c)):
        return f"its {name} is not trusted: its counts do not match its digest (edited, or sealed by another gate)"
    return None if c is None else Acceptance(c.drafted, c.accepted, c.drafts, c.replies, c.replies_without,
                                             c.replies_drafting)
