"""The run format (strict-gate/run@1): a directory with manifest.json and records.jsonl.

This is the interchange contract with other engines (docs/run-format.md). A run is
written as it goes, one flushed record per finished prompt, and the manifest is
rewritten atomically at the start ("running") and at the end ("complete" or
"failed"), so a crash never leaves a directory that reads as complete.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonlines

from strict_gate.errors import IncompleteRunError, InputError
from strict_gate.redact import redact_env, scrub, scrub_json

RUN_SCHEMA = "strict-gate/run@1"
MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
PARTIAL = "records.jsonl.partial"
FINISH_REASONS = ("stop", "length")

TopK = tuple[tuple[int, float], ...]
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Timing:
    """Wall-clock figures of one request, measured by the gate or reported by the engine."""

    ttft_s: float | None = None
    total_s: float | None = None

    def to_json(self) -> dict:
        return {"ttft_s": self.ttft_s, "total_s": self.total_s}


@dataclass(frozen=True)
class Record:
    """One prompt's greedy output. top_logprobs[i] is step i's top-k, logprob descending."""

    id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    top_logprobs: tuple[TopK, ...] | None = None
    samples: tuple[tuple[int, ...], ...] | None = None
    error: str | None = None
    timing: Timing | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "top_logprobs": None
            if self.top_logprobs is None
            else [[[t, lp] for t, lp in step] for step in self.top_logprobs],
        }
        if self.samples is not None:
            out["samples"] = [list(s) for s in self.samples]
        if self.error is not None:
            out["error"] = self.error
        if self.timing is not None:
            out["timing"] = self.timing.to_json()
        return out

    def logprob_at(self, step: int, token: int) -> float | None:
        """Logprob of `token` at `step` from the stored top-k, or None when not in it."""
        if self.top_logprobs is None or step >= len(self.top_logprobs):
            return None
        for t, lp in self.top_logprobs[step]:
            if t == token:
                return lp
        return None


def sort_topk(pairs) -> TopK:
    """Normalise top-k pairs: descending logprob, ties by token id, so writers agree."""
    return tuple(sorted(((int(t), float(lp)) for t, lp in pairs), key=lambda x: (-x[1], x[0])))


@dataclass(frozen=True)
class EngineInfo:
    """What produced a run: recorded in the manifest and every report."""

    kind: str
    model: str | None = None
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        # The one place engine descriptions are made: every manifest, report and console line
        # gets the redacted env (the engine keeps the real values in its own process env).
        object.__setattr__(self, "env", redact_env(self.env))
        for name in ("model", "options", "versions", "tokenizer"):
            object.__setattr__(self, name, scrub_json(getattr(self, name)))

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "model": self.model,
            "options": self.options,
            "env": self.env,
            "versions": self.versions,
            "tokenizer": self.tokenizer,
        }

    @classmethod
    def from_json(cls, d: dict) -> "EngineInfo":
        return cls(
            kind=d.get("kind", "?"),
            model=d.get("model"),
            options=dict(d.get("options") or {}),
            env=dict(d.get("env") or {}),
            versions=dict(d.get("versions") or {}),
            tokenizer=d.get("tokenizer"),
        )


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    top_logprobs: int
    temperature: float = 0.0

    def to_json(self) -> dict:
        return {"max_tokens": self.max_tokens, "top_logprobs": self.top_logprobs, "temperature": self.temperature}


@dataclass(frozen=True)
class Manifest:
    engine: EngineInfo
    prompt_set: dict  # {"name", "sha256", "count"}
    sampling: Sampling
    created: str
    status: str = "running"  # running | complete | failed
    finished: str | None = None
    records: int = 0
    runs: int = 1
    determinism: dict | None = None
    error: str | None = None
    failed_prompt: str | None = None
    schema: str = RUN_SCHEMA

    @property
    def prompt_ids(self) -> list[str] | None:
        """The prompt set's ids in order, when the writer recorded them (expected records)."""
        ids = self.prompt_set.get("ids")
        return list(ids) if isinstance(ids, list) else None

    def to_json(self) -> dict:
        out = {
            "schema": self.schema,
            "status": self.status,
            "engine": self.engine.to_json(),
            "prompt_set": self.prompt_set,
            "sampling": self.sampling.to_json(),
            "created": self.created,
            "finished": self.finished,
            "records": self.records,
            "runs": self.runs,
        }
        if self.determinism is not None:
            out["determinism"] = self.determinism
        if self.error is not None:
            out["error"] = self.error
            out["failed_prompt"] = self.failed_prompt
        return out


@dataclass(frozen=True)
class Run:
    path: str
    manifest: Manifest
    records: dict[str, Record]

    @property
    def complete(self) -> bool:
        return self.manifest.status == "complete"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _dumps(obj: Any, indent: int | None = None) -> str:
    """JSON as UTF-8 text; ASCII escapes when a string holds a lone surrogate (an engine's
    "\\ud800"), which no UTF-8 file can hold raw but an escape keeps exactly."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    return text if not _SURROGATE.search(text) else json.dumps(obj, indent=indent)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temp file and rename, so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = scrub_json(obj)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_dumps(obj, indent=2))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    text = scrub(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class RunWriter:
    """Writes a run directory incrementally. Use as a context manager or call finish()/fail()."""

    def __init__(self, directory: str | Path, manifest: Manifest):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in (RECORDS, PARTIAL):
            if (self.dir / stale).exists():
                (self.dir / stale).unlink()
        self.manifest = replace(manifest, status="running", records=0)
        write_json_atomic(self.dir / MANIFEST, self.manifest.to_json())
        self._f = open(self.dir / PARTIAL, "w", encoding="utf-8")
        # flush=True: each finished prompt is on disk before the next one starts.
        self._lines = jsonlines.Writer(self._f, flush=True, dumps=_dumps)
        self._count = 0
        self._closed = False


    def add(self, record: Record) -> None:
        self._lines.write(scrub_json(record.to_json()))
        self._count += 1

    def _close(self, **changes) -> Manifest:
        if self._closed:
            return self.manifest
        self._lines.close()
        self._f.close()
        os.replace(self.dir / PARTIAL, self.dir / RECORDS)
        self.manifest = replace(self.manifest, records=self._count, finished=now_iso(), **changes)
        write_json_atomic(self.dir / MANIFEST, self.manifest.to_json())
        self._closed = True
        return self.manifest

    def finish(self, **changes) -> Manifest:
        return self._close(status="complete", **changes)

    def fail(self, error: str, failed_prompt: str | None = None) -> Manifest:
        return self._close(status="failed", error=error, failed_prompt=failed_prompt)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.fail(f"{exc_type.__name__}: {exc}")
        else:
            self.finish()


# ---------------------------------------------------------------- reading


def _req(d: dict, key: str, types, path: str, line: int | None):
    if key not in d:
        raise InputError(f'missing "{key}"', path=path, line=line)
    v = d[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise InputError(f'"{key}" has the wrong type ({type(v).__name__})', path=path, line=line)
    return v


def _int_list(v, what: str, path: str, line: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise InputError(f'"{what}" must be a list of integers', path=path, line=line)
    return tuple(v)


def parse_record(d: object, path: str, line: int | None) -> Record:
    """Validate one records.jsonl object; errors name file and line."""
    if not isinstance(d, dict):
        raise InputError("each record must be a JSON object", path=path, line=line)
    rid = _req(d, "id", str, path, line)
    prompt_ids = _int_list(d.get("prompt_token_ids"), "prompt_token_ids", path, line)
    error = d.get("error")
    if error is not None and not isinstance(error, str):
        raise InputError('"error" must be a string', path=path, line=line)
    token_ids = _int_list(d.get("token_ids", []), "token_ids", path, line)
    finish = d.get("finish_reason")
    if error is None and finish not in FINISH_REASONS:
        raise InputError(f'"finish_reason" must be one of {FINISH_REASONS}, got {finish!r}', path=path, line=line)
    tl = d.get("top_logprobs")
    top: tuple[TopK, ...] | None = None
    if tl is not None:
        if not isinstance(tl, list):
            raise InputError('"top_logprobs" must be a list (one entry per generated step) or null', path=path, line=line)
        if len(tl) != len(token_ids):
            raise InputError(
                f'"top_logprobs" has {len(tl)} steps but "token_ids" has {len(token_ids)}', path=path, line=line
            )
        steps = []
        for i, step in enumerate(tl):
            if not isinstance(step, list):
                raise InputError(f'"top_logprobs"[{i}] must be a list of [token_id, logprob] pairs', path=path, line=line)
            pairs = []
            for pair in step:
                ok = (
                    isinstance(pair, list)
                    and len(pair) == 2
                    and isinstance(pair[0], int)
                    and not isinstance(pair[0], bool)
                    and isinstance(pair[1], (int, float))
                    and not isinstance(pair[1], bool)
                )
                if not ok:
                    raise InputError(
                        f'"top_logprobs"[{i}] holds {pair!r}; expected [token_id, logprob]', path=path, line=line
                    )
                lp = float(pair[1])
                if math.isnan(lp) or lp > 1e-6:
                    raise InputError(f'"top_logprobs"[{i}] has an invalid logprob {pair[1]!r}', path=path, line=line)
                pairs.append((pair[0], lp))
            steps.append(sort_topk(pairs))
        top = tuple(steps)
    samples = None
    if d.get("samples") is not None:
        raw = d["samples"]
        if not isinstance(raw, list) or not raw:
            raise InputError('"samples" must be a non-empty list of token-id lists', path=path, line=line)
        samples = tuple(_int_list(s, "samples[]", path, line) for s in raw)
        if error is None and samples[0] != token_ids:
            raise InputError('"samples"[0] must equal "token_ids" (the first run is the golden)', path=path, line=line)
    timing = None
    if isinstance(d.get("timing"), dict):
        t = d["timing"]
        timing = Timing(ttft_s=t.get("ttft_s"), total_s=t.get("total_s"))
    return Record(
        id=rid,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        finish_reason=finish,
        top_logprobs=top,
        samples=samples,
        error=error,
        timing=timing,
    )


def read_records(path: Path, *, tolerate_torn_tail: bool = False) -> dict[str, Record]:
    spath = str(path)
    out: dict[str, Record] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if tolerate_torn_tail and lineno >= len(lines) - 1:
                break  # the writer died mid-line: the torn record is not a record
            raise InputError(f"invalid JSON: {e.msg} (column {e.colno})", path=spath, line=lineno) from None
        rec = parse_record(obj, spath, lineno)
        if rec.id in out:
            raise InputError(f"duplicate record id {rec.id!r}", path=spath, line=lineno)
        out[rec.id] = rec
    return out


def read_manifest(directory: Path) -> Manifest:
    mpath = directory / MANIFEST
    spath = str(mpath)
    if not directory.is_dir():
        raise InputError("run directory not found", path=str(directory))
    if not mpath.exists():
        raise InputError("not a run directory: manifest.json is missing", path=str(directory))
    try:
        d = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg}", path=spath, line=e.lineno) from None
    if not isinstance(d, dict):
        raise InputError("manifest must be a JSON object", path=spath)
    if d.get("schema") != RUN_SCHEMA:
        raise InputError(f'"schema" is {d.get("schema")!r}; this version reads {RUN_SCHEMA!r}', path=spath)
    for key in ("engine", "prompt_set", "sampling"):
        if not isinstance(d.get(key), dict):
            raise InputError(f'missing or invalid "{key}"', path=spath)
    s = d["sampling"]
    try:
        sampling = Sampling(int(s["max_tokens"]), int(s["top_logprobs"]), float(s.get("temperature", 0.0)))
    except (KeyError, TypeError, ValueError):
        raise InputError('"sampling" needs integer "max_tokens" and "top_logprobs"', path=spath) from None
    status = d.get("status")
    if status not in ("running", "complete", "failed"):
        raise InputError(f'"status" must be running, complete or failed, got {status!r}', path=spath)
    return Manifest(
        engine=EngineInfo.from_json(d["engine"]),
        prompt_set=d["prompt_set"],
        sampling=sampling,
        created=str(d.get("created", "")),
        status=status,
        finished=d.get("finished"),
        records=int(d.get("records", 0)),
        runs=int(d.get("runs", 1)),
        determinism=d.get("determinism"),
        error=d.get("error"),
        failed_prompt=d.get("failed_prompt"),
    )


def load_run(directory: str | Path, *, allow_incomplete: bool = False) -> Run:
    """Read a run directory. An unfinished run is refused unless allow_incomplete."""
    d = Path(directory)
    manifest = read_manifest(d)
    if manifest.status == "running":
        if not allow_incomplete:
            raise IncompleteRunError(
                "run is not finished (status running: its writer stopped or is still going); "
                "re-run the arm, it cannot be compared as complete",
                path=str(d),
            )
        path = d / PARTIAL if (d / PARTIAL).exists() else d / RECORDS
        records = read_records(path, tolerate_torn_tail=True) if path.exists() else {}
        return Run(str(d), manifest, records)
    if manifest.status == "failed" and not allow_incomplete:
        raise IncompleteRunError(
            f"run failed: {manifest.error} (on prompt {manifest.failed_prompt})", path=str(d)
        )
    rpath = d / RECORDS
    if not rpath.exists():
        raise InputError("records.jsonl is missing", path=str(d))
    records = read_records(rpath)
    if manifest.status == "complete" and len(records) != manifest.records:
        raise InputError(
            f"manifest says {manifest.records} records, records.jsonl holds {len(records)}", path=str(d)
        )
    return Run(str(d), manifest, records)
