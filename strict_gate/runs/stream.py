"""A run on disk read in bounded memory: an index of byte offsets, records decoded by the chunk.

Holding two 10,000 x 512 x top-20 runs whole takes about 10 GB. Here a run is an index (the
offset, length and line of each record, by id, found in one pass that decodes almost nothing)
and records are decoded and audited when asked for, a chunk at a time, by the same code and
the same rules as read_records (runs/audit.py: every rule, every record). What stays in memory
is the caller's choice: RunRecords keeps the whole records it is told to (the prompts a report
draws) and a slim copy of the rest (token ids as int32, the small fields) whose top-k is read
back from disk only when someone looks at it.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from strict_gate.errors import InputError
from strict_gate.runs.audit import vocab_size
from strict_gate.runs.reader import (
    _DECODER,
    _build,
    _Columns,
    _columns,
    _decode_error,
    _Record,
    read_manifest,
    records_path,
)
from strict_gate.runs.records import Record, Run, RunStatus, TopK
from strict_gate.runs.slim import Slim, Spill
from strict_gate.runs.topk_text import bulk_columns

_ID_PREFIXES = (b'{"id": "', b'{"id":"')  # how RunWriter (and most writers) start a record


class _IdOnly(msgspec.Struct):
    id: str


_ID_DECODER = msgspec.json.Decoder(_IdOnly)


@dataclass(frozen=True)
class RecordIndex:
    """Where each record of a records file is: file order, by id. `stamp` is the file's
    (size, mtime) when indexed; a file that changes afterwards is refused, never half-read."""

    path: Path
    ids: tuple[str, ...]
    offsets: np.ndarray
    lengths: np.ndarray
    lines: np.ndarray
    where: dict[str, int]
    stamp: tuple[int, int]

    @classmethod
    def empty(cls, path: Path) -> RecordIndex:
        z = np.zeros(0, dtype=np.int64)
        return cls(path, (), z, z, z, {}, (0, 0))


_gc_lock = threading.Lock()
_paused = 0
_was_enabled = True


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic collector paused while a chunk is decoded: decoding makes millions of
    containers and no cycle, and the collector's passes over them doubled the decode time.
    Counted, as two threads decode at once (runs/prefetch.py): the last one out restores it."""
    global _paused, _was_enabled
    with _gc_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _gc_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _quick_id(head: bytes) -> str | None:
    """The record's id read off the line's start when it is a plain string there (decoding the
    line checks it later); None when it is not (then the line is decoded for it)."""
    for p in _ID_PREFIXES:
        if head.startswith(p):
            end = head.find(b'"', len(p))
            raw = head[len(p):end]
            if end > 0 and b"\\" not in raw:
                try:
                    return raw.decode("utf-8")
                except UnicodeDecodeError:
                    return None
    return None


def _line_id(line: bytes, spath: str, lineno: int) -> str:
    """The record's id: off the line's start, else by a decoder that skips every other field."""
    rid = _quick_id(line)
    if rid is not None:
        return rid
    try:
        return _ID_DECODER.decode(line).id
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:  # the full decoder's message, as read_records gives it
            _DECODER.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise InputError(_decode_error(e, line), path=spath, line=lineno) from None
        raise InputError('invalid record: "id" is not a string', path=spath, line=lineno) from None


_HEAD = 4096  # bytes of a line looked at for its id; the rest of a long line is never copied
_BLOCK = 8 << 20  # bytes read at a time into one reused buffer: memory flat in the file's size
_BLANK = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


class _Line:
    """The line being read: where it starts, its first _HEAD bytes, whether all of it so far is blank."""

    __slots__ = ("blank", "head", "offset")

    def __init__(self, offset: int = 0):
        self.offset, self.head, self.blank = offset, b"", True

    def add(self, buf: bytearray, start: int, end: int) -> None:
        if len(self.head) < _HEAD:
            self.head += buf[start:min(end, start + _HEAD - len(self.head))]
        if self.blank and end > start:
            self.blank = buf[start:start + 1] in _BLANK and not buf[start:end].strip()


def _lines(f) -> Iterator[tuple[int, int, int, bytes]]:
    """(line number, offset, length, head) of each line that is not blank, found with a C
    search over blocks of the file read into one buffer; head is the line's first _HEAD bytes."""
    buf = bytearray(_BLOCK)
    lineno, at, line = 0, 0, _Line()  # at: the file offset of buf[0]
    while n := f.readinto(buf):
        start = 0
        while start < n:
            nl = buf.find(b"\n", start, n)
            end = n if nl < 0 else nl + 1
            line.add(buf, start, end)
            if nl < 0:
                break  # the line goes on in the next block
            lineno += 1
            if not line.blank:
                yield lineno, line.offset, at + end - line.offset, line.head
            line, start = _Line(at + end), end
        at += n
    if at > line.offset:  # a last line without a newline
        lineno += 1
        if not line.blank:
            yield lineno, line.offset, at - line.offset, line.head


def _torn(line: bytes) -> bool:
    """The writer died mid-line: the line is not a record (only ever the last one)."""
    if line.rstrip().endswith(b"}"):
        return False
    try:
        _DECODER.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return True
    return False


def index_records(path: Path, *, tolerate_torn_tail: bool = False) -> RecordIndex:
    """One pass over a records file: ids, offsets and lines (a long line is never copied whole)."""
    spath = str(path)
    ids: list[str] = []
    offsets: list[int] = []
    lengths: list[int] = []
    lines: list[int] = []
    where: dict[str, int] = {}
    try:
        stamp = _stamp(path)
        with open(path, "rb", buffering=0) as f:
            whole = lambda offset, length: os.pread(f.fileno(), length, offset)  # noqa: E731
            for lineno, offset, length, head in _lines(f):
                rid = _quick_id(head)
                if rid is None:
                    rid = _line_id(whole(offset, length), spath, lineno)
                if rid in where:
                    raise InputError(f"duplicate record id {rid!r}", path=spath, line=lineno)
                where[rid] = len(ids)
                ids.append(rid)
                offsets.append(offset)
                lengths.append(length)
                lines.append(lineno)
            if tolerate_torn_tail and ids and _torn(whole(offsets[-1], lengths[-1])):
                del where[ids.pop()]
                offsets.pop(), lengths.pop(), lines.pop()
    except OSError as e:
        raise InputError(f"cannot read records: {e}", path=spath) from None
    as_array = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    return RecordIndex(path, tuple(ids), as_array(offsets), as_array(lengths), as_array(lines), where, stamp)


class RunRecords(Mapping[str, Record]):
    """A run's records by id, read from its file on demand. `read` decodes and audits a chunk;
    `keep` remembers a record slim (its ids in a spill file, its top-k read back from the run file
    when asked for); any other id is decoded when looked up."""

    def __init__(self, index: RecordIndex, *, max_tokens: int | None, vocab_size: int | None):
        self.index = index
        self._limits = {"max_tokens": max_tokens, "vocab_size": vocab_size}
        self._slim: dict[str, Slim] = {}
        self._spill = Spill()  # the slim copies' token ids, on disk: memory flat in the prompt count

    def __len__(self) -> int:
        return len(self.index.ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self.index.ids)

    def __contains__(self, rid: object) -> bool:
        return rid in self.index.where

    def __getitem__(self, rid: str) -> Record:
        slim = self._slim.get(rid)
        if slim is not None:
            return slim.record(rid, self._spill, lambda: self._reread(rid))
        if rid not in self.index.where:
            raise KeyError(rid)
        return self.read([rid])[rid]

    def _reread(self, rid: str) -> Sequence[TopK]:
        top = self.read([rid])[rid].top_logprobs
        assert top is not None  # the slim copy was made from this very line, which had a top-k
        return top

    def size(self, rid: str) -> int:
        """Bytes of the record's line; 0 when the run has no such record."""
        pos = self.index.where.get(rid)
        return 0 if pos is None else int(self.index.lengths[pos])

    def read(self, rids: Iterable[str]) -> dict[str, Record]:
        """Decode and audit the records of these ids (those the run has) from the file."""
        idx = self.index
        spath = str(idx.path)
        positions = sorted(idx.where[r] for r in rids if r in idx.where)  # file order: sequential reads
        if not positions:
            return {}
        with _no_gc():
            cols = self._decode(positions)
        return _build(cols, spath, cols.lines.__getitem__, **self._limits)

    def _decode(self, positions: list[int]) -> _Columns:
        idx = self.index
        spath = str(idx.path)
        try:
            if _stamp(idx.path) != idx.stamp:
                raise InputError("the records file changed while it was being read; compare again", path=spath)
            with open(idx.path, "rb") as f:
                lines = []
                for pos in positions:
                    f.seek(int(idx.offsets[pos]))
                    lines.append(f.read(int(idx.lengths[pos])))
        except OSError as e:
            raise InputError(f"cannot read records: {e}", path=spath) from None
        linenos = [int(idx.lines[p]) for p in positions]
        expected = [idx.ids[p] for p in positions]
        cols = bulk_columns(lines, linenos, expected)
        return cols if cols is not None else _exact_columns(lines, linenos, expected, spath)

    def keep(self, record: Record) -> None:
        self._slim[record.id] = Slim.of(record, self._spill)


def _check_id(raw, expected: str, spath: str, lineno: int) -> None:
    if raw.id != expected:
        raise InputError(f'invalid record: the line has "id" twice ({expected!r}, {raw.id!r})', path=spath, line=lineno)


def _exact_columns(lines: list[bytes], linenos: list[int], expected: list[str], spath: str) -> _Columns:
    """Each line decoded whole, as read_records does: exact types, errors that name the line."""
    decoded: list[tuple[_Record, int | None]] = []
    for line, lineno, rid in zip(lines, linenos, expected):
        try:
            raw = _DECODER.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise InputError(_decode_error(e, line), path=spath, line=lineno) from None
        _check_id(raw, rid, spath, lineno)
        decoded.append((raw, lineno))
    return _columns(decoded, spath)


def open_run(directory: str | Path, *, allow_incomplete: bool = False) -> Run:
    """load_run's checks (manifest, status, record count) with records read on demand:
    the run's `records` is a RunRecords over an index of its file."""
    d = Path(directory)
    manifest = read_manifest(d)
    path, torn = records_path(d, manifest, allow_incomplete=allow_incomplete)
    index = index_records(path, tolerate_torn_tail=torn) if path is not None else RecordIndex.empty(d)
    if manifest.status == RunStatus.COMPLETE and len(index.ids) != manifest.records:
        raise InputError(f"manifest says {manifest.records} records, records.jsonl holds {len(index.ids)}", path=str(d))
    records = RunRecords(index, max_tokens=manifest.sampling.max_tokens, vocab_size=vocab_size(manifest.engine))
    return Run(str(d), manifest, records)
