"""Typed option tables: unknown keys are errors with a "did you mean", types are checked.

Engines declare their options as a frozen dataclass; the gate config hands each arm's
table here before any model is loaded, so a typo fails in milliseconds, not after a load.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from strict_gate.errors import ConfigError


def did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _accepts(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return isinstance(value, (list, tuple)) and (not args or all(_accepts(args[0], v) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def parse_options(cls: type, table: dict, *, where: str, line_of=None):
    """Build `cls` (a dataclass) from a TOML table, rejecting unknown keys and wrong types.

    `line_of(key)` may return the config line of a key, for the error message.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in table.items():
        line = line_of(key) if line_of else None
        if key not in fields:
            raise ConfigError(
                f"unknown key {key!r} in [{where}]{did_you_mean(key, fields)} "
                f"(known: {', '.join(sorted(fields))})",
                path=getattr(line_of, "path", None),
                line=line,
            )
        if not _accepts(hints[key], value):
            raise ConfigError(
                f"[{where}] {key} = {value!r}: expected {_type_name(hints[key])}",
                path=getattr(line_of, "path", None),
                line=line,
            )
        kwargs[key] = tuple(value) if typing.get_origin(hints[key]) is tuple else value
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"[{where}] needs {', '.join(missing)}", path=getattr(line_of, "path", None))
    return cls(**kwargs)
