"""Secrets are never written: what the gate writes or prints shows "<redacted>" instead.

The rule, in one place:
- An environment variable NAME looks secret when it contains, case-insensitively, one of
  SECRET_MARKERS (HF_TOKEN, OPENAI_API_KEY, DB_PASSWD, AWS_SESSION_TOKEN, MY_AUTH_HEADER ...).
  Matching is a plain substring on purpose: a harmless name that matches (MAX_TOKENS) only
  loses its value in reports, while a secret that slipped through would be published.
  The value of such an entry is shown as "<redacted>" in manifests, reports, the copied
  gate.toml and the console; the engine itself still receives the real value.
- Known secret VALUES are scrubbed from any text the gate writes (an engine error that echoes
  the key, a server log that prints its arguments): the values of secret-named arm env entries
  (as the config gives them or, where a report's gate.toml reads "<redacted>", as the engine
  inherits them from the environment) and the key behind an openai engine's `api_key_env`. A
  value shorter than MIN_SECRET_CHARS is not scrubbed from free text (a "1" cannot be told apart
  from ordinary text); it is still redacted by name.

Known values are kept for the whole process, registered when a config is read (restore_env), so
before anything is written: an exception message that crosses layers (engine, runner, gate,
console) must be scrubbed wherever it is finally written. What is written goes through one of
scrub / scrub_json / scrub_obj / scrub_bytes (an engine's output on its way into engine.log), and
every directory a command writes gets a last scrub_tree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

SECRET_MARKERS = (
    "TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "AUTH", "COOKIE",
    "SESSION", "PRIVATE",
)
REDACTED = "<redacted>"
MIN_SECRET_CHARS = 8

_known: set[str] = set()


def is_secret_name(name: str) -> bool:
    upper = str(name).upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def register(value: object) -> None:
    """Remember a secret value so that every later write scrubs it."""
    if isinstance(value, str) and len(value) >= MIN_SECRET_CHARS:
        _known.add(value)


def register_env(env: Mapping[str, object]) -> None:
    for name, value in env.items():
        if is_secret_name(name):
            register(str(value))


def redact_env(env: Mapping[str, object]) -> dict:
    """An env table as it may be shown: secret-looking names keep their name, not their value."""
    register_env(env)
    return {k: (REDACTED if is_secret_name(k) else scrub_json(v)) for k, v in env.items()}


def unset_redacted(env: Mapping[str, str]) -> list[str]:
    """The entries read back as "<redacted>" whose variable the environment does not set: an arm
    run without them is another engine configuration (a server answering without its key), so
    the config reader refuses them (exit 2) before any engine starts."""
    return [k for k, v in env.items() if v == REDACTED and k not in os.environ]


def restore_env(env: Mapping[str, str]) -> dict[str, str]:
    """An arm's env table as read from a config, to apply. An entry read back as "<redacted>" (a
    report's gate.toml: `gate --resume`, `diagnose`, `localize`) takes its value from the
    environment the command runs in, where the secret lives (unset_redacted: checked first).
    Every secret-named value is registered here: whatever reads a config knows its secrets
    before it writes anything, the manifest of a resumed run names the entry as the first did."""
    applied = {k: os.environ[k] if v == REDACTED else v for k, v in env.items()}
    register_env(applied)
    return applied


def scrub(text: str) -> str:
    for value in sorted(_known, key=len, reverse=True):  # longest first: overlapping values go whole
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def scrub_json(obj: Any) -> Any:
    """Strings inside dicts, lists and tuples scrubbed; anything else as is."""
    if not _known:
        return obj
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {scrub_json(k): scrub_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(scrub_json(v) for v in obj)
    return obj


def scrub_obj(obj: Any) -> Any:
    """scrub_json through (frozen) dataclasses too: a whole result, before any renderer escapes
    its text (an escaped secret, hf\\_abc in markdown, is still the secret)."""
    if not _known:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            if f.init:
                old = getattr(obj, f.name)
                new = scrub_obj(old)
                if new is not old:
                    changes[f.name] = new
        return dataclasses.replace(obj, **changes) if changes else obj
    if isinstance(obj, str):
        new = scrub(obj)
        return obj if new == obj else new
    if isinstance(obj, dict):
        items = {scrub_obj(k): scrub_obj(v) for k, v in obj.items()}
        return obj if all(k in obj and obj[k] is v for k, v in items.items()) else items
    if isinstance(obj, (list, tuple)):
        values = [scrub_obj(v) for v in obj]
        return obj if all(a is b for a, b in zip(values, obj)) else type(obj)(values)
    return obj


def scrub_bytes(data: bytes) -> bytes:
    """scrub() of raw output (an engine's stderr on its way into engine.log), as UTF-8."""
    for value in sorted(_known, key=len, reverse=True):
        data = data.replace(value.encode("utf-8"), REDACTED.encode())
    return data


def scrub_tree(root: Path) -> None:
    """Last pass over a finished report or run directory: known values are removed from every
    file, engine logs included (a server that logs its own arguments, key and all)."""
    if not _known or not root.is_dir():
        return
    for path in root.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        clean = scrub_bytes(data)
        if clean == data:
            continue
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))  # the scrubbed file keeps its mode
            f.write(clean)
        os.replace(tmp, path)


# ---------------------------------------------------------------- gate.toml


def _redact_env_tables(data: dict) -> dict:
    return {
        k: redact_env(v) if k == "env" and isinstance(v, dict)
        else _redact_env_tables(v) if isinstance(v, dict) else scrub_json(v)
        for k, v in data.items()
    }


def redact_toml(text: str) -> str:
    """A config's text to copy beside a report: the same text when it holds no secret, else the
    same settings re-written (valid TOML, comments dropped) with the secrets redacted."""
    data = tomllib.loads(text)
    clean = _redact_env_tables(data)
    if clean == data and scrub(text) == text:
        return text
    return "# a copy of the gate config with secrets redacted (strict-gate); comments are not kept\n" + _dump(clean)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_str(key)


def _toml_str(s: str) -> str:
    # A JSON string is a TOML basic string, except that TOML also forbids a raw DEL.
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (datetime, date, time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _dump(data: dict, prefix: tuple[str, ...] = ()) -> str:
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            path = (*prefix, k)
            lines += ["", "[" + ".".join(_toml_key(p) for p in path) + "]", _dump(v, path).rstrip("\n")]
    return "\n".join(lines) + "\n"
