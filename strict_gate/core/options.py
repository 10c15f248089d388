"""Typed option tables: unknown keys are errors with a "did you mean", types are checked.

Engines declare their options as a frozen dataclass; the gate config hands each arm's
table here before any model is loaded, so a typo fails in milliseconds, not after a load.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from strict_gate.errors import ConfigError


@dataclass(frozen=True)
class Bound:
    """A numeric option's range, checked when the config is read (finite always)."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None

    def problem(self, value) -> str | None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        if not math.isfinite(value):
            return "must be a finite number"
        for op, limit, ok in (("> ", self.gt, lambda v, x: v > x), (">= ", self.ge, lambda v, x: v >= x),
                              ("<= ", self.le, lambda v, x: v <= x)):
            if limit is not None and not ok(value, limit):
                return f"must be {op}{limit:g}"
        return None


@dataclass(frozen=True)
class Pattern:
    """A string option's form, e.g. a torch device."""

    regex: str
    example: str

    def problem(self, value) -> str | None:
        if isinstance(value, str) and not re.fullmatch(self.regex, value):
            return f"is not a valid value (e.g. {self.example})"
        return None


Seconds = Annotated[float, Bound(gt=0)]
PositiveInt = Annotated[int, Bound(ge=1)]
NonNegativeInt = Annotated[int, Bound(ge=0)]
Fraction = Annotated[float, Bound(gt=0, le=1)]
Device = Annotated[str, Pattern(r"cpu|mps|meta|(cuda|xpu|npu|hpu)(:\d+)?", "cpu, cuda, cuda:1")]


def did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _accepts(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is Annotated:
        return _accepts(typing.get_args(tp)[0], value)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp))
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
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _constraint_problem(tp: Any, value: Any) -> str | None:
    """The first Bound/Pattern the value breaks, looking through unions and Optional."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        for m in meta:
            if isinstance(m, (Bound, Pattern)) and _accepts(base, value):
                problem = m.problem(value)
                if problem:
                    return problem
        return None
    if origin in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            if _accepts(a, value):
                return _constraint_problem(a, value)
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    return None


def parse_options(cls: type, table: dict, *, where: str, line_of=None):
    """Build `cls` (a dataclass) from a TOML table, rejecting unknown keys and wrong types.

    `line_of(key)` may return the config line of a key, for the error message.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls, include_extras=True)
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
        problem = _constraint_problem(hints[key], value)
        if problem:
            raise ConfigError(
                f"[{where}] {key} = {value!r} {problem}", path=getattr(line_of, "path", None), line=line
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
