"""Writing a run directory as it goes (`RunWriter`): one flushed record per finished prompt, the
manifest rewritten atomically at the start and the end, records.seal beside the records. The
types it writes are runs/records.py's."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from strict_gate.core.redact import scrub_json
from strict_gate.errors import InputError
from strict_gate.runs.layout import RunDir
from strict_gate.runs.records import (
    EngineInfo,
    Manifest,
    Record,
    RunStatus,
    _dumps,
    now_iso,
    write_json_atomic,
    write_text_atomic,
)
from strict_gate.runs.seal import next_seal, record_lines


def _chain(key: str, lines: Sequence[bytes]) -> list[str]:
    out, prev = [], key
    for line in lines:
        prev = next_seal(prev, line)
        out.append(prev)
    return out


class RunWriter:
    """Writes a run directory incrementally. Use as a context manager or call finish()/fail().

    `keep` continues an interrupted run in place (`strict-gate gate --resume`): the stored
    records of those prompts stay byte for byte, every other stored line (an error record,
    a torn tail) is dropped, and new records are appended after them. Without `keep` the
    directory's old records are removed. `seal_key` (a gate's arm) keeps records.seal, a
    running hash per line (runs/seal.py), written after each record line.
    """

    def __init__(self, directory: str | Path, manifest: Manifest, *, keep: Collection[str] = (),
                 seal_key: str | None = None):
        self.dir = Path(directory)
        self.files = RunDir(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        kept = self._kept_lines(manifest, set(keep)) if keep else []
        self.manifest = replace(
            manifest, status=RunStatus.RUNNING, records=len(kept), finished=None, error=None, failed_prompt=None
        )
        # Order matters for a crash in between: the manifest says "running" before the records
        # file changes, and a reader of a running run prefers the .partial file.
        write_json_atomic(self.files.manifest, self.manifest.to_json())
        write_text_atomic(self.files.partial, "".join(kept))
        self.files.records.unlink(missing_ok=True)
        self._f = open(self.files.partial, "a", encoding="utf-8")  # noqa: SIM115 (held for the run; close() closes it)
        self._seal = None
        self._seal_last = ""
        if seal_key is not None:  # the kept lines' chain, from the bytes now on disk
            seals = _chain(seal_key, record_lines(self.files.partial))
            self._seal_last = seals[-1] if seals else seal_key
            write_text_atomic(self.files.seal, "".join(f"{d}\n" for d in seals))
            self._seal = open(self.files.seal, "a", encoding="ascii")  # noqa: SIM115 (closed by close())
        else:
            self.files.seal.unlink(missing_ok=True)
        self._count = len(kept)
        self._closed = False

    def _kept_lines(self, stored: Manifest, keep: set[str]) -> list[str]:
        """The stored lines of the prompts to keep, read from the file load_run reads."""
        partial = self.files.partial
        source = partial if stored.status == RunStatus.RUNNING and partial.exists() else self.files.records
        lines = []
        for line in source.read_text(encoding="utf-8").split("\n") if source.exists() else ():
            try:
                rid = json.loads(line).get("id")
            except (json.JSONDecodeError, AttributeError):
                continue  # a torn tail or a blank line: not a record
            if rid in keep:
                keep.discard(rid)
                lines.append(line + "\n")
        if keep:
            raise InputError(f"records of {sorted(keep)[:5]} vanished while resuming the run", path=str(source))
        return lines

    def describe(self, engine: EngineInfo) -> None:
        """The engine as it described itself once started (its hello): on disk before the
        first record, so a run killed at any point names the versions that made it."""
        self.manifest = replace(self.manifest, engine=engine)
        write_json_atomic(self.files.manifest, self.manifest.to_json())

    def add(self, record: Record) -> None:
        # Each finished prompt is on disk (and sealed) before the next one starts.
        line = _dumps(scrub_json(record.to_json())) + "\n"
        self._f.write(line)
        self._f.flush()
        if self._seal is not None:
            self._seal_last = next_seal(self._seal_last, line.encode("utf-8"))
            self._seal.write(self._seal_last + "\n")
            self._seal.flush()
        self._count += 1

    def _close(self, **changes) -> Manifest:
        if self._closed:
            return self.manifest
        self._f.close()
        if self._seal is not None:
            self._seal.close()
        os.replace(self.files.partial, self.files.records)
        self.manifest = replace(self.manifest, records=self._count, finished=now_iso(), **changes)
        write_json_atomic(self.files.manifest, self.manifest.to_json())
        self._closed = True
        return self.manifest

    def finish(self, **changes) -> Manifest:
        return self._close(status=RunStatus.COMPLETE, **changes)

    def fail(self, error: str, failed_prompt: str | None = None) -> Manifest:
        return self._close(status=RunStatus.FAILED, error=error, failed_prompt=failed_prompt)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.fail(f"{exc_type.__name__}: {exc}")
        else:
            self.finish()
