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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from strict_gate.core.files import new_temp_file
from strict_gate.core.redact import redact_env, scrub, scrub_json

RUN_SCHEMA = "strict-gate/run@1"
FINISH_REASONS = ("stop", "length")

TopK = tuple[tuple[int, float], ...]
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ScoredStep:
    """Teacher-forced scoring of one continuation token given everything before it."""

    token_id: int
    logprob: float | None  # logprob of token_id; None when the engine only reports its top-k
    top: TopK

    @property
    def argmax(self) -> int:
        return self.top[0][0]


class TopSteps(Sequence[TopK]):
    """One record's per-step top-k as a view over a run's columnar arrays.

    A run read from disk keeps its top-k as padded numpy matrices (ids padded with -1,
    logprobs with -inf, `width` real entries per row); a record's steps are rows
    [start, stop). Reading 1,000 x 512 x 20 pairs as Python tuples is what made runs
    slow to read, so a step becomes tuples only when someone looks at it.
    """

    __slots__ = ("ids", "lps", "width")

    def __init__(self, ids: np.ndarray, lps: np.ndarray, width: np.ndarray):
        self.ids, self.lps, self.width = ids, lps, width

    def __len__(self) -> int:
        return len(self.width)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        w = int(self.width[i])
        return tuple(zip(self.ids[i, :w].tolist(), self.lps[i, :w].tolist()))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == tuple(map(tuple, b)) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TopSteps({len(self)} steps)"

    def lookup(self, tokens: Sequence[int]) -> list[float | None]:
        """The logprob of tokens[i] at step i (None where the step does not list it), for the
        first len(tokens) steps, in one pass over the arrays. Padding ids are negative and a
        token id never is (the audit's rule), so padding never matches."""
        n = min(len(tokens), len(self))
        hit = self.ids[:n] == np.asarray(tokens[:n], dtype=np.int64)[:, None]
        found = self.lps[:n][np.arange(n), hit.argmax(axis=1)].tolist()
        return [lp if ok else None for lp, ok in zip(found, hit.any(axis=1).tolist())]


@dataclass(frozen=True)
class Timing:
    """Wall-clock figures of one request, measured by the gate or reported by the engine."""

    ttft_s: float | None = None
    total_s: float | None = None

    def to_json(self) -> dict:
        """Non-finite figures (a clock that failed) are written as unknown: run files are strict JSON."""
        return {k: v if v is None or math.isfinite(v) else None
                for k, v in (("ttft_s", self.ttft_s), ("total_s", self.total_s))}


@dataclass(frozen=True)
class TextReply:
    """What a text-only server (an openai arm with `text_only = true`) answered for one prompt: its
    text, and the counts it stated. The record's token_ids are that text tokenized in context by
    the arm's tokenizer; the gate keeps the server's own figures so the judge can check them."""

    text: str  # the completion text as the server returned it
    usage_prompt_tokens: int | None = None  # usage.prompt_tokens: how many tokens the server fed
    usage_completion_tokens: int | None = None  # usage.completion_tokens: how many it generated
    server_prompt_token_ids: tuple[int, ...] | None = None  # its /tokenize of the prompt text, where it has one

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "usage_prompt_tokens": self.usage_prompt_tokens,
            "usage_completion_tokens": self.usage_completion_tokens,
            "server_prompt_token_ids": None if self.server_prompt_token_ids is None
            else list(self.server_prompt_token_ids),
        }

    def misread(self, prompt_ids: Sequence[int]) -> str | None:
        """Why the server's own figures say it did not read the prompt as `prompt_ids`, or None:
        usage.prompt_tokens off (a prompt ignored, a BOS added or dropped), its /tokenize other."""
        n, fed = len(prompt_ids), self.usage_prompt_tokens
        if fed is not None and fed != n:
            how = ("added a token, such as a second BOS" if fed == n + 1 else
                   "dropped a token, such as the BOS" if fed == n - 1 else
                   "ignored or truncated the prompt" if fed < n else "tokenized the prompt otherwise")
            return f"the server fed {fed} prompt tokens (usage.prompt_tokens) for a prompt of {n} ids: it {how}"
        ids = self.server_prompt_token_ids
        if ids is not None and tuple(ids) != tuple(prompt_ids):
            k = next((i for i, (a, b) in enumerate(zip(ids, prompt_ids)) if a != b), min(len(ids), n))
            return (f"the server's /tokenize of the prompt text differs from the prompt's ids at index {k} (server "
                    f"{list(ids[k:k + 3])}, {len(ids)} ids; gate {list(prompt_ids[k:k + 3])}, {n} ids)")
        return None


@dataclass(frozen=True)
class Record:
    """One prompt's greedy output. top_logprobs[i] is step i's top-k, logprob descending."""

    id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    top_logprobs: Sequence[TopK] | None = None  # tuples from live engines, TopSteps when read
    samples: tuple[tuple[int, ...], ...] | None = None
    error: str | None = None
    timing: Timing | None = None
    text_only: TextReply | None = None  # a text-only server's reply: no logprobs were claimed

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
        if self.text_only is not None:  # absent on every other record: run@1 unchanged
            out["text_only"] = self.text_only.to_json()
        return out

    def logprobs_at(self, tokens: Sequence[int]) -> list[float | None]:
        """logprob_at(i, tokens[i]) for each i, at once where the top-k is a run's arrays."""
        lookup = getattr(self.top_logprobs, "lookup", None)
        if lookup is not None:
            found = lookup(tokens)
            return found + [None] * (len(tokens) - len(found))
        return [self.logprob_at(i, t) for i, t in enumerate(tokens)]

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
    def from_json(cls, d: dict) -> EngineInfo:
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
    ignore_eos: bool = False  # generate exactly max_tokens (the speed arm); never set for a token gate

    def to_json(self) -> dict:
        out = {"max_tokens": self.max_tokens, "top_logprobs": self.top_logprobs, "temperature": self.temperature}
        if self.ignore_eos:  # absent in every run a gate writes: run@1 unchanged
            out["ignore_eos"] = True
        return out


class RunStatus(StrEnum):
    """Where a run stands; the value is how manifest.json spells it."""

    RUNNING = "running"  # started, or its writer died: never read as complete
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass(frozen=True)
class Manifest:
    engine: EngineInfo
    prompt_set: dict  # {"name", "sha256", "count"}
    sampling: Sampling
    created: str
    status: RunStatus = RunStatus.RUNNING
    finished: str | None = None
    records: int = 0
    runs: int = 1
    determinism: dict | None = None
    error: str | None = None
    failed_prompt: str | None = None
    resumed: tuple[dict, ...] = ()  # one entry per resume of an interrupted run: {"at", "kept", "remaining"}
    schema: str = RUN_SCHEMA

    @property
    def prompt_ids(self) -> list[str] | None:
        """The prompt set's ids in order, when the writer recorded them (expected records)."""
        ids = self.prompt_set.get("ids")
        return list(ids) if isinstance(ids, list) else None

    def to_json(self) -> dict:
        out: dict[str, object] = {
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
        if self.resumed:
            out["resumed"] = list(self.resumed)
        return out


@dataclass(frozen=True)
class Run:
    path: str
    manifest: Manifest
    records: Mapping[str, Record]  # a dict, or a RunRecords reading the run's file on demand

    @property
    def complete(self) -> bool:
        return self.manifest.status == RunStatus.COMPLETE


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _dumps(obj: Any, indent: int | None = None) -> str:
    """JSON as UTF-8 text; ASCII escapes when a string holds a lone surrogate (an engine's
    "\\ud800"), which no UTF-8 file can hold raw but an escape keeps exactly."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    return text if not _SURROGATE.search(text) else json.dumps(obj, indent=indent)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON via a temp file and rename, so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = scrub_json(obj)
    fd, tmp = new_temp_file(path.parent, f".{path.name}.")
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
    write_parts_atomic(path, (text,))


def write_parts_atomic(path: Path, parts: Iterable[str]) -> None:
    """A text file written a part at a time through a temp file and a rename, so a page made as
    it is written (report.html) is never held whole, and readers see the old file or the new one.
    Each part is scrubbed alone: sound only because a part never cuts a secret in two (report.html's
    parts are whole elements, and a secret value lies inside one element's text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp_file(path.parent, f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for part in parts:
                f.write(scrub(part))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
