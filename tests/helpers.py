"""Hand-built inputs for tests: records with chosen tokens and logprobs written as real run dirs,
and gate configs written from dicts (TOML text by a small serializer: tomllib only reads)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strict_gate.runs.records import (
    EngineInfo,
    Manifest,
    Record,
    Sampling,
    now_iso,
    sort_topk,
)
from strict_gate.runs.writer import RunWriter


def step(*pairs: tuple[int, float]):
    return sort_topk(pairs)


def confident(token: int, lp: float = -0.01, runner_up: int | None = None, gap: float = 3.0):
    """A step where `token` wins by `gap` nats over the runner-up."""
    other = runner_up if runner_up is not None else token + 1000
    return step((token, lp), (other, lp - gap), (other + 1, lp - gap - 1.0))


def rec(pid: str, tokens, *, prompt=(1, 2, 3), tops=None, finish=None, samples=None, error=None) -> Record:
    tokens = tuple(tokens)
    if tops is None and error is None:
        tops = tuple(confident(t) for t in tokens)
    return Record(
        id=pid,
        prompt_token_ids=tuple(prompt),
        token_ids=tokens if error is None else (),
        finish_reason=None if error else (finish or "stop"),
        top_logprobs=None if tops is None else tuple(tops),
        samples=None if samples is None else tuple(tuple(s) for s in samples),
        error=error,
    )


def write_run(path: Path, records, *, sha="0" * 64, max_tokens=4, top=5, model="m", finish=True) -> Path:
    manifest = Manifest(
        engine=EngineInfo(kind="hand", model=model),
        prompt_set={"name": "hand", "sha256": sha, "count": len(records)},
        sampling=Sampling(max_tokens, top),
        created=now_iso(),
    )
    w = RunWriter(path, manifest)
    for r in records:
        w.add(r)
    if finish:
        w.finish()
    return path


def child_pid(parent_pid: int, marker: bytes) -> int | None:
    """The child of parent_pid whose command line holds marker (an engine the gate started),
    found through /proc (Linux)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent_pid and marker in cmd:
            return int(stat.parent.name)
    return None


# ---------------------------------------------------------------- gate configs from dicts

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s: str) -> str:
    """A TOML basic string: quotes, backslashes and every control character escaped."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _string(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)  # repr: shortest round trip; inf and -inf as TOML spells them
    if isinstance(v, (str, os.PathLike)):
        return _string(os.fspath(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML value for {v!r}")


def _table(table: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    """A table's own keys, then each sub-table under its [dotted.header] (TOML wants that order)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in table.items() if not isinstance(v, Mapping)]
    for k, v in table.items():
        if isinstance(v, Mapping):
            sub = (*path, k)
            lines += ["[" + ".".join(_key(p) for p in sub) + "]", *_table(v, sub)]
    return lines


def toml_text(table: Mapping[str, Any]) -> str:
    """TOML for a dict of str, int, float, bool, paths, lists and nested tables (as [headers])."""
    return "".join(line + "\n" for line in _table(table, ()))


def gate_text(*, reference: Mapping[str, Any] | None = None, candidate: Mapping[str, Any] | None = None,
              **top: Any) -> str:
    """A gate config: the top-level keys, then [reference], [candidate] and any other table in `top`."""
    arms = {role: arm for role, arm in (("reference", reference), ("candidate", candidate)) if arm is not None}
    tables = {k: v for k, v in top.items() if isinstance(v, Mapping)}
    return toml_text({k: v for k, v in top.items() if k not in tables} | arms | tables)


def write_gate(where: Path, *, reference: Mapping[str, Any] | None = None, candidate: Mapping[str, Any] | None = None,
               file: str = "gate.toml", **top: Any) -> Path:
    """Write gate_text(...) to where/file and return its path."""
    path = where / file
    path.write_text(gate_text(reference=reference, candidate=candidate, **top), encoding="utf-8")
    return path


def smollm2_converted(need: str = "model.safetensors") -> Path:
    """SmolLM2-135M's conversion where `strict-gate model convert pypi:smollm2-135m` puts it (the
    product's own cache rule); `need` absent there, the test skips here and fails under CI, whose
    install converts it."""
    import pytest

    from strict_gate.core.registry_models import lookup, model_dir

    path = model_dir(lookup("pypi:smollm2-135m"))
    if not (path / need).is_file():
        why = f"SmolLM2-135M is not converted at {path} (strict-gate model convert pypi:smollm2-135m)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}", pytrace=False)
        pytest.skip(why)
    return path


def section(report: Mapping[str, Any], name: str) -> Any:
    """A feature's own figures in a report.json (report@3's `features` mapping), None when the gate
    did not run it."""
    s = report.get("features", {}).get(name)
    return None if s is None else s["section"]


def pid_alive(pid: int) -> bool:
    """Running, not a zombie (a container's init may never reap one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cascade_gate(where: Path, name: str) -> str:
    """gate.toml in `where` (relative paths, output_dir "reports"): tests/engines/cascade_engine.py copied
    beside it, its candidate flipping a near-tie at position 2 of one prompt, then emitting tokens the
    reference ranks far below its argmax."""
    import json
    import shutil

    shutil.copy(Path(__file__).parent / "engines" / "cascade_engine.py", where / "cascade_engine.py")
    (where / "prompts.jsonl").write_text(json.dumps({"id": "p0", "token_ids": [1, 2, 3]}) + "\n")
    write_gate(where, name=name, prompts="prompts.jsonl", max_tokens=8, top_logprobs=5, band=0.5,
               output_dir="reports", reference={"kind": "command", "command": ["python", "cascade_engine.py",
                                                                                "reference"]},
               candidate={"kind": "command", "command": ["python", "cascade_engine.py", "candidate", "--flip", "2",
                                                         "--garbage"]})
    return "gate.toml"
