"""Prompt sets: one JSON object a line, validated with file and line, identified by a hash.

The hash covers what reaches the engines (ids, text or token ids, in order) and not the
tags, so re-tagging a set keeps its baselines valid.
"""

from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import dataclass, field
from pathlib import Path

from strict_gate.errors import InputError

_ALLOWED_KEYS = {"id", "text", "token_ids", "tags"}
MAX_PROMPT_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    tags: tuple[str, ...] = ()

    def canonical(self) -> dict:
        out: dict = {"id": self.id}
        if self.text is not None:
            out["text"] = self.text
        else:
            out["token_ids"] = list(self.token_ids or ())
        return out


@dataclass(frozen=True)
class PromptSet:
    name: str
    path: str
    prompts: tuple[Prompt, ...]
    sha256: str = field(default="")

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.prompts]


def prompt_set_sha256(prompts: tuple[Prompt, ...] | list[Prompt]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p.canonical(), sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def check_regular_file(path: Path, what: str, limit: int) -> None:
    """Stat before reading: /dev/zero or a FIFO would never end, a huge file would fill memory.
    A missing file raises FileNotFoundError, for the caller to word."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"not a regular file; expected {what}", path=str(path))
    if st.st_size > limit:
        raise InputError(f"{st.st_size} bytes; {what} is at most {limit} bytes", path=str(path))


def _is_unicode(s: str) -> bool:
    """False for a string JSON decoded with a lone surrogate: no report file could hold it."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_line(obj: object, path: str, lineno: int) -> Prompt:
    if not isinstance(obj, dict):
        raise InputError("each line must be a JSON object", path=path, line=lineno)
    unknown = set(obj) - _ALLOWED_KEYS
    if unknown:
        raise InputError(
            f"unknown key(s) {sorted(unknown)}; allowed: id, text, token_ids, tags", path=path, line=lineno
        )
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid.strip():
        raise InputError('missing or empty "id" (a non-empty string)', path=path, line=lineno)
    for key in ("id", "text"):
        if isinstance(obj.get(key), str) and not _is_unicode(obj[key]):
            raise InputError(f'"{key}" holds an unpaired surrogate (\\ud800-\\udfff): not valid Unicode',
                             path=path, line=lineno)
    has_text, has_ids = "text" in obj, "token_ids" in obj
    if has_text == has_ids:
        raise InputError(
            f'prompt {pid!r} needs exactly one of "text" or "token_ids"', path=path, line=lineno
        )
    tags = obj.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise InputError(f'prompt {pid!r}: "tags" must be a list of strings', path=path, line=lineno)
    if has_text:
        text = obj["text"]
        if not isinstance(text, str) or text == "":
            raise InputError(f'prompt {pid!r}: "text" must be a non-empty string', path=path, line=lineno)
        return Prompt(id=pid, text=text, tags=tuple(tags))
    ids = obj["token_ids"]
    if not isinstance(ids, list) or not ids:
        raise InputError(f'prompt {pid!r}: "token_ids" must be a non-empty list', path=path, line=lineno)
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise InputError(
            f'prompt {pid!r}: "token_ids" must hold non-negative integers only', path=path, line=lineno
        )
    return Prompt(id=pid, token_ids=tuple(ids), tags=tuple(tags))


def _json_line(raw: bytes, path: str, lineno: int) -> object:
    """One line as JSON. Split on b"\\n" only: str.splitlines would also split on U+2028 and
    other separators that valid JSON strings may hold raw. Whatever json refuses, including
    an integer of more than 4300 digits and nesting too deep to parse, is InputError."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 (byte {e.start + 1})", path=path, line=lineno) from None
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg} (column {e.colno})", path=path, line=lineno) from None
    except RecursionError:
        raise InputError("invalid JSON: nested too deeply", path=path, line=lineno) from None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion: ..."
        raise InputError(f"invalid JSON: {str(e).partition(':')[0]}", path=path, line=lineno) from None


def load_prompts(path: str | Path) -> PromptSet:
    """Read and validate a prompt set; every error names the file and line."""
    p = Path(path)
    spath = str(path)
    try:
        check_regular_file(p, "a prompt set (a .jsonl file)", MAX_PROMPT_BYTES)
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError("prompt set not found", path=spath) from None
    except OSError as e:
        raise InputError(f"cannot read prompt set: {e}", path=spath) from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        prompt = _parse_line(_json_line(raw, spath, lineno), spath, lineno)
        if prompt.id in seen:
            raise InputError(
                f"duplicate id {prompt.id!r} (first at line {seen[prompt.id]})", path=spath, line=lineno
            )
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise InputError("prompt set is empty: a gate over zero prompts proves nothing", path=spath)
    tup = tuple(prompts)
    return PromptSet(name=p.stem, path=spath, prompts=tup, sha256=prompt_set_sha256(tup))
