"""Typed option tables: unknown keys are errors with a "did you mean", types are checked.

One mechanism for every table a config holds: a gate's top-level keys, an arm's own keys
and each engine's options are frozen dataclasses whose field types carry their rules
(Bound, Pattern, Rule, Parse). parse_options reads a TOML table into one, naming the file,
the line and the rule; the same checks run again whenever an instance is made in Python
(Checked), so the code that uses the options never re-checks them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from strict_gate.errors import ConfigError, StrictGateError


@dataclass(frozen=True)
class Bound:
    """A numeric option's range, checked when the config is read (finite always)."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    unit: str = ""  # said after the rule: "must be >= 0 (nats)"
    why: str = ""  # said after the rule: "must be >= 2: near-ties are judged from the top alternatives"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        if not math.isfinite(value):
            return "must be a finite number" + self._tail()
        for op, limit, ok in (("> ", self.gt, lambda v, x: v > x), (">= ", self.ge, lambda v, x: v >= x),
                              ("<= ", self.le, lambda v, x: v <= x)):
            if limit is not None and not ok(value, limit):
                return f"must be {op}{limit:g}" + self._tail()
        return None

    def _tail(self) -> str:
        return (f" ({self.unit})" if self.unit else "") + (f": {self.why}" if self.why else "")


@dataclass(frozen=True)
class Pattern:
    """A string option's form, e.g. a torch device."""

    regex: str
    example: str

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str) and not re.fullmatch(self.regex, value):
            return f"is not a valid value (e.g. {self.example})"
        return None


@dataclass(frozen=True)
class Rule:
    """A rule no type can say, in words: `holds(value)` must be true."""

    holds: Callable[[Any], bool]
    words: str  # "must be ...", the end of the sentence "key = value ..."

    def problem(self, value: Any) -> str | None:
        return None if self.holds(value) else self.words


@dataclass(frozen=True)
class Parse:
    """A value read by the function that owns its rule (check_policy, check_band): `read`
    returns the typed value or raises ValueError/ConfigError, whose message is the whole
    sentence. `takes` is the type the raw value must have first (None: the field's own)."""

    read: Callable[[Any], Any]
    takes: Any = None


@dataclass(frozen=True)
class Example:
    """How a required key is written, said when it is missing: needs prompts = "path/to/set.jsonl"."""

    text: str


Seconds = Annotated[float, Bound(gt=0)]
PositiveInt = Annotated[int, Bound(ge=1)]
NonNegativeInt = Annotated[int, Bound(ge=0)]
Fraction = Annotated[float, Bound(gt=0, le=1)]
Device = Annotated[str, Pattern(r"cpu|mps|meta|(cuda|xpu|npu|hpu)(:\d+)?", "cpu, cuda, cuda:1")]
DType = Literal["float32", "bfloat16", "float16", "auto"]  # the weights' dtype; auto: the model's own
Argv = Annotated[list[str], Rule(lambda v: bool(v) and all(v), "must be a non-empty list of non-empty strings "
                                 "(argv, no shell)")]
NonEmptyList = Annotated[list[str], Rule(bool, "must be a non-empty list")]


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
        args = typing.get_args(tp)
        return isinstance(value, dict) and (not args or all(_accepts(args[1], v) for v in value.values()))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return f"a table of {_type_name(args[1])}" if args else "a table"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _constraint_problem(tp: Any, value: Any) -> str | None:
    """The first Bound/Pattern/Rule the value breaks, looking through unions and Optional."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        for m in meta:
            if isinstance(m, (Bound, Pattern, Rule)) and _accepts(base, value):
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


def _meta(tp: Any, kind: type) -> Any:
    """The field type's first metadata of class `kind` (Parse, Example), or None."""
    if typing.get_origin(tp) is not Annotated:
        return None
    return next((m for m in typing.get_args(tp)[1:] if isinstance(m, kind)), None)


class Refused(ValueError):
    """A value a field cannot hold; `whole`: the problem is a sentence of its own (a Parse's)."""

    def __init__(self, problem: str, *, whole: bool = False):
        super().__init__(problem)
        self.problem, self.whole = problem, whole

    def message(self, prefix: str, key: str, value: Any) -> str:
        return prefix + (self.problem if self.whole else f"{key} = {value!r} {self.problem}")


def read_value(tp: Any, value: Any) -> Any:
    """The value a field of type `tp` holds for `value` (parsed; a list made a tuple for a
    tuple field); Refused says why there is none."""
    parse = _meta(tp, Parse)
    takes = parse.takes if parse is not None and parse.takes is not None else tp
    if not _accepts(takes, value):
        what = "is not allowed" if typing.get_origin(takes) is Literal else "has the wrong type"
        raise Refused(f"{what}: expected {_type_name(takes)}")
    problem = _constraint_problem(tp, value)
    if problem:
        raise Refused(problem)
    if parse is not None:
        try:
            value = parse.read(value)
        except (ValueError, StrictGateError) as e:
            raise Refused(str(e), whole=True) from None
    base = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
    return tuple(value) if typing.get_origin(base) is tuple and isinstance(value, list) else value


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """The dataclass's init fields and their types, metadata included (read once per class)."""
    if cls not in _FIELD_TYPES:
        hints = typing.get_type_hints(cls, include_extras=True)
        _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    return _FIELD_TYPES[cls]


class Checked:
    """Base of a typed option table: its field types are checked however an instance is made,
    from a config or in Python (a ConfigError naming the class, the field and the rule)."""

    def __post_init__(self) -> None:
        for name, tp in field_types(type(self)).items():
            value = getattr(self, name)
            try:
                typed = read_value(tp, value)
            except Refused as e:
                raise ConfigError(e.message(f"{type(self).__name__}: ", name, value)) from None
            if typed is not value:
                object.__setattr__(self, name, typed)  # frozen: the parsed value, set once here


def _needs(name: str, tp: Any) -> str:
    base = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
    if base is dict or typing.get_origin(base) is dict:
        return f"a [{name}] table"
    example = _meta(tp, Example)
    return f"{name} = {example.text}" if example is not None else name


def parse_options(cls: type, table: dict, *, where: str | None, line_of=None, siblings: Collection[str] = ()):
    """Build `cls` (a dataclass) from a TOML table, rejecting unknown keys and wrong types.

    `where` names the table in messages (None: the file's top level); `line_of(key)` may
    return the config line of a key and `line_of.path` the file, for the error message.
    `siblings` are keys the same TOML table holds for another reader (an arm's kind, env and
    runs beside its engine's options): not passed here, but suggested and listed as known.
    """
    types_ = field_types(cls)
    known = set(types_) | set(siblings)
    path = getattr(line_of, "path", None)
    prefix = f"[{where}] " if where else ""
    kwargs = {}
    for key, value in table.items():
        line = line_of(key) if line_of else None
        if key not in types_:
            inside = f" in [{where}]" if where else ""
            raise ConfigError(
                f"unknown key {key!r}{inside}{did_you_mean(key, known)} (known: {', '.join(sorted(known))})",
                path=path,
                line=line,
            )
        try:
            kwargs[key] = read_value(types_[key], value)
        except Refused as e:
            raise ConfigError(e.message(prefix, key, value), path=path, line=line) from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = [
        n
        for n in types_
        if n not in kwargs
        and fields[n].default is dataclasses.MISSING
        and fields[n].default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{prefix}needs {', '.join(_needs(n, types_[n]) for n in missing)}", path=path)
    return cls(**kwargs)
