"""Reading run directories fast, and auditing them on the way in.

records.jsonl is decoded column-wise: token ids and top-k logprobs land in numpy arrays
(never one Python tuple per pair), and the run audit (strict_gate.runs.audit) checks every
step of every record with vectorised rules before anything is compared. Large files go
through pyarrow's multi-threaded JSON reader; small ones, torn partial files and any
file the fast path rejects go through msgspec line by line, which is also what names
the exact line of a bad record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

from strict_gate.errors import IncompleteRunError, InputError
from strict_gate.runs.audit import StepTable, audit_manifest, audit_records, vocab_size
from strict_gate.runs.layout import RunDir, RunFile
from strict_gate.runs.records import (
    RUN_SCHEMA,
    EngineInfo,
    Manifest,
    Record,
    Run,
    RunStatus,
    Sampling,
    TextReply,
    Timing,
    TopSteps,
    sort_topk,
)

FAST_PATH_BYTES = 8 << 20  # below this, msgspec line by line is faster than starting pyarrow


class _Timing(msgspec.Struct):
    ttft_s: float | None = None
    total_s: float | None = None


TokenId = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # int64; the audit narrows it


class _TextOnly(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    usage_prompt_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    usage_completion_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    server_prompt_token_ids: list[TokenId] | None = None


class _Fields(msgspec.Struct):
    """A record's fields but its top-k, as a records file spells them."""

    id: str
    prompt_token_ids: list[TokenId]
    token_ids: list[TokenId] = []
    finish_reason: str | None = None
    samples: list[list[TokenId]] | None = None
    error: str | None = None
    timing: _Timing | None = None
    text_only: _TextOnly | None = None


class _Record(_Fields):
    top_logprobs: list[list[tuple[TokenId, float]]] | None = None


class _RawTopRecord(_Fields):
    """The top-k kept as raw JSON text (runs/topk_text.py reads its numbers in bulk)."""

    top_logprobs: msgspec.Raw = msgspec.Raw(b"null")


_DECODER = msgspec.json.Decoder(_Record)
_RAW_TOP_DECODER = msgspec.json.Decoder(_RawTopRecord)


@dataclass
class _Columns:
    """One run's records as columns, before they become Record objects."""

    raws: Sequence[_Fields]  # the small per-record fields (top_logprobs dropped)
    lines: list[int | None]  # the file line of each record (None: not known)
    table: StepTable  # every record's steps, concatenated in record order
    has_top: np.ndarray  # (records,) bool: the record carries top_logprobs


def _decode_error(e: Exception, line: bytes) -> str:
    msg = str(e)
    if any(lit in line for lit in (b"NaN", b"Infinity")):
        return f"rule finite-logprobs: a logprob is NaN or Infinity (not JSON; write a finite number) ({msg})"
    if isinstance(e, msgspec.ValidationError):
        if msg.startswith("Expected `int` >=") or msg.startswith("Expected `int` <="):
            return f"rule token-range: a token id does not fit in 64 bits ({msg})"
        return f"invalid record: {msg}"
    return f"invalid JSON: {msg}"


def _columns(decoded: list[tuple[_Record, int | None]], spath: str) -> _Columns:
    """Split decoded records into their small fields and one table of every step."""
    steps: list[list[tuple[int, float]]] = []
    has_top: list[bool] = []
    for r, line in decoded:
        top = r.top_logprobs
        has_top.append(top is not None)
        if top is not None:
            if len(top) != len(r.token_ids):
                raise InputError(
                    f'rule steps-match-tokens: "top_logprobs" has {len(top)} steps but "token_ids" has '
                    f"{len(r.token_ids)}",
                    path=spath,
                    line=line,
                )
            steps.extend(top)
            r.top_logprobs = None
    return _Columns(
        [r for r, _ in decoded], [ln for _, ln in decoded], StepTable.from_steps(steps), np.array(has_top, dtype=bool)
    )


def _precise(data: bytes, spath: str, tolerate_torn_tail: bool) -> _Columns:
    """msgspec, one line at a time: exact types, and errors that name the line."""
    decoded: list[tuple[_Record, int | None]] = []
    all_lines = data.split(b"\n")
    last = max((i for i, ln in enumerate(all_lines) if ln.strip()), default=-1)
    for i, line in enumerate(all_lines):
        if not line.strip():
            continue
        try:
            decoded.append((_DECODER.decode(line), i + 1))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            if tolerate_torn_tail and i == last and not line.rstrip().endswith(b"}"):
                break  # the writer died mid-line: the torn record is not a record
            raise InputError(_decode_error(e, line), path=spath, line=i + 1) from None
    return _columns(decoded, spath)


def _fast(path: Path) -> _Columns | None:
    """pyarrow's JSON reader over the whole file; None when it rejects anything (the
    precise path then finds and names the bad line)."""
    import pyarrow as pa
    import pyarrow.json as pj

    pair = pa.list_(pa.float64())
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int64())),
            ("token_ids", pa.list_(pa.int64())),
            ("finish_reason", pa.string()),
            ("top_logprobs", pa.list_(pa.list_(pair))),
            ("samples", pa.list_(pa.list_(pa.int64()))),
            ("error", pa.string()),
            ("timing", pa.struct([("ttft_s", pa.float64()), ("total_s", pa.float64())])),
            ("text_only", pa.struct([("text", pa.string()), ("usage_prompt_tokens", pa.int64()),
                                     ("usage_completion_tokens", pa.int64()),
                                     ("server_prompt_token_ids", pa.list_(pa.int64()))])),
        ]
    )
    try:
        table = pj.read_json(
            path,
            read_options=pj.ReadOptions(block_size=16 << 20),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    if table.num_rows == 0 or table.column("id").null_count or table.column("prompt_token_ids").null_count:
        return None
    top = table.column("top_logprobs").combine_chunks()
    has_top = ~np.asarray(top.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    step_lists = top.flatten()  # list<list<double>> of every step of every record with top
    pair_lists = step_lists.flatten()
    if pair_lists.null_count or step_lists.null_count:
        return None
    pair_len = np.diff(pair_lists.offsets.to_numpy())
    if len(pair_len) and (pair_len != 2).any():
        return None  # a "pair" that is not [token_id, logprob]
    flat = pair_lists.flatten().to_numpy(zero_copy_only=False).reshape(-1, 2)
    ids_f = flat[:, 0]
    if not np.array_equal(ids_f, np.trunc(ids_f)) or (np.abs(ids_f) > 2**53).any():
        return None  # a token id that is not an integer
    width = np.diff(step_lists.offsets.to_numpy())
    n_steps = np.diff(top.offsets.to_numpy()) if len(top) else np.zeros(0, dtype=np.int64)
    tokens = table.column("token_ids").combine_chunks()
    n_tokens = np.diff(tokens.offsets.to_numpy())
    if (has_top & (n_steps != n_tokens)).any():
        return None
    rows = table.drop_columns(["top_logprobs"]).to_pylist()
    raws = []
    for row in rows:
        row = {k: v for k, v in row.items() if v is not None}
        try:
            raws.append(msgspec.convert(row, _Record))
        except msgspec.ValidationError:
            return None
    return _Columns(raws, [], StepTable.from_flat(ids_f.astype(np.int64), flat[:, 1].copy(), width), has_top)


def _line_finder(data_path: Path):
    """Line numbers for the fast path, computed only when a rule fails."""

    def line_of(index: int) -> int | None:
        n = -1
        with open(data_path, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    n += 1
                    if n == index:
                        return lineno
        return None

    return line_of


def read_records(
    path: Path,
    *,
    tolerate_torn_tail: bool = False,
    max_tokens: int | None = None,
    vocab_size: int | None = None,
) -> dict[str, Record]:
    """Read and audit a records file; every violation is an InputError naming file and line."""
    spath = str(path)
    size = path.stat().st_size
    cols = None
    if size >= FAST_PATH_BYTES and not tolerate_torn_tail:
        cols = _fast(path)
    if cols is None:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read records: {e}", path=spath) from None
        cols = _precise(data, spath, tolerate_torn_tail)
        line_of = cols.lines.__getitem__
    else:
        line_of = _line_finder(path)
    return _build(cols, spath, line_of, max_tokens=max_tokens, vocab_size=vocab_size)


def _build(cols: _Columns, spath: str, line_of, *, max_tokens: int | None, vocab_size: int | None) -> dict[str, Record]:
    finding = audit_records(cols.raws, cols.table, cols.has_top, max_tokens=max_tokens, vocab_size=vocab_size)
    if finding is not None:
        index, message = finding
        raise InputError(message, path=spath, line=line_of(index))
    out: dict[str, Record] = {}
    step = 0
    table = cols.table
    for i, r in enumerate(cols.raws):
        n = len(r.token_ids)
        top = None
        if cols.has_top[i]:
            top = TopSteps(table.ids[step : step + n], table.lps[step : step + n], table.width[step : step + n])
            step += n
        if r.id in out:
            raise InputError(f"duplicate record id {r.id!r}", path=spath, line=line_of(i))
        out[r.id] = Record(
            id=r.id,
            prompt_token_ids=tuple(r.prompt_token_ids),
            token_ids=tuple(r.token_ids) if r.error is None else (),
            finish_reason=r.finish_reason,
            top_logprobs=top,
            samples=None if r.samples is None else tuple(tuple(s) for s in r.samples),
            error=r.error,
            timing=None if r.timing is None else Timing(r.timing.ttft_s, r.timing.total_s),
            text_only=_text_reply(r.text_only),
        )
    return out


def _text_reply(t: _TextOnly | None) -> TextReply | None:
    if t is None:
        return None
    ids = None if t.server_prompt_token_ids is None else tuple(t.server_prompt_token_ids)
    return TextReply(t.text, t.usage_prompt_tokens, t.usage_completion_tokens, ids)


def parse_record(obj: object, where: str, line: int | None, *, max_tokens: int | None = None) -> Record:
    """One record given as a decoded JSON object (an engine's reply), audited like a file's.
    The engine protocol lets an engine list a step's pairs in any order: they are sorted
    here, and every other rule applies as written."""
    try:
        raw = msgspec.convert(obj, _Record)
    except msgspec.ValidationError as e:
        raise InputError(f"invalid record: {e}", path=where, line=line) from None
    if raw.top_logprobs is not None:
        raw.top_logprobs = [list(sort_topk(step)) for step in raw.top_logprobs]
    cols = _columns([(raw, line)], where)
    return _build(cols, where, lambda _i: line, max_tokens=max_tokens, vocab_size=None)[raw.id]


# ---------------------------------------------------------------- manifests and runs


def read_manifest(directory: Path) -> Manifest:
    mpath = RunDir(directory).manifest
    spath = str(mpath)
    if not directory.is_dir():
        raise InputError("run directory not found", path=str(directory))
    if not mpath.exists():
        raise InputError(f"not a run directory: {RunFile.MANIFEST} is missing", path=str(directory))
    try:
        d = json.loads(mpath.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"invalid JSON: {e}", path=spath, line=getattr(e, "lineno", None)) from None
    except OSError as e:
        raise InputError(f"cannot read manifest: {e}", path=spath) from None
    if not isinstance(d, dict):
        raise InputError("manifest must be a JSON object", path=spath)
    if d.get("schema") != RUN_SCHEMA:
        raise InputError(f'"schema" is {d.get("schema")!r}; this version reads {RUN_SCHEMA!r}', path=spath)
    for key in ("engine", "prompt_set", "sampling"):
        if not isinstance(d.get(key), dict):
            raise InputError(f'missing or invalid "{key}"', path=spath)
    s = d["sampling"]
    ints = {k: s.get(k) for k in ("max_tokens", "top_logprobs")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints.values()):
        raise InputError('"sampling" needs non-negative integers "max_tokens" and "top_logprobs"', path=spath)
    temperature = s.get("temperature", 0.0)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise InputError(f'"sampling.temperature" must be a number, got {temperature!r}', path=spath)
    status = d.get("status")
    if status not in tuple(RunStatus):
        raise InputError(f'"status" must be running, complete or failed, got {status!r}', path=spath)
    for key, default in (("records", 0), ("runs", 1)):
        v = d.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InputError(f'"{key}" must be a non-negative integer, got {v!r}', path=spath)
    manifest = Manifest(
        engine=EngineInfo.from_json(d["engine"]),
        prompt_set=d["prompt_set"],
        sampling=Sampling(ints["max_tokens"], ints["top_logprobs"], float(temperature)),
        created=str(d.get("created", "")),
        status=RunStatus(status),
        finished=d.get("finished"),
        records=d.get("records", 0),
        runs=d.get("runs", 1),
        determinism=d.get("determinism"),
        error=d.get("error"),
        failed_prompt=d.get("failed_prompt"),
        resumed=tuple(r for r in d.get("resumed") or () if isinstance(r, dict)),
    )
    audit_manifest(manifest, spath)
    return manifest


def records_path(d: Path, manifest: Manifest, *, allow_incomplete: bool) -> tuple[Path | None, bool]:
    """The records file to read for this manifest (None: a running run that wrote none yet)
    and whether a torn last line is tolerated; an unfinished run is refused unless allow_incomplete."""
    files = RunDir(d)
    if manifest.status == RunStatus.RUNNING:
        if not allow_incomplete:
            raise IncompleteRunError(
                "run is not finished (status running: its writer stopped or is still going); "
                "re-run the arm, it cannot be compared as complete",
                path=str(d),
            )
        path = files.partial if files.partial.exists() else files.records
        return (path if path.exists() else None), True
    if manifest.status == RunStatus.FAILED and not allow_incomplete:
        raise IncompleteRunError(f"run failed: {manifest.error} (on prompt {manifest.failed_prompt})", path=str(d))
    if not files.records.exists():
        raise InputError(f"{RunFile.RECORDS} is missing", path=str(d))
    return files.records, False


def load_run(directory: str | Path, *, allow_incomplete: bool = False) -> Run:
    """Read and audit a run directory. An unfinished run is refused unless allow_incomplete."""
    d = Path(directory)
    manifest = read_manifest(d)
    limits = {"max_tokens": manifest.sampling.max_tokens, "vocab_size": vocab_size(manifest.engine)}
    path, torn = records_path(d, manifest, allow_incomplete=allow_incomplete)
    records = read_records(path, tolerate_torn_tail=torn, **limits) if path is not None else {}
    if manifest.status == RunStatus.COMPLETE and len(records) != manifest.records:
        raise InputError(f"manifest says {manifest.records} records, {RunFile.RECORDS} holds {len(records)}", path=str(d))
    return Run(str(d), manifest, records)
