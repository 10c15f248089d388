"""What every feature's section shares: its result's informational default, the shape a loader
reads a report.json section into, and the one way it is read (core/features.py's `load`).

A section body is read strictly: every key the feature's `to_json` writes is required and no
other is taken (a key a rewrite would silently drop is refused), and a body that does not read is
an InputError naming the section and the field, never a traceback. What is written is checked
against the same shape first (`written`): report.json's shapes are declared once, in
judge/schema.py and in each feature's loader, and both write and read through them.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from strict_gate.errors import InputError

T = TypeVar("T")


class Informational:
    """A feature's result that annotates the report and never sets the gate's exit code (noise,
    drift): judge/result.py's FeatureResult without a verdict of its own."""

    @property
    def exit_code(self) -> int:
        return 0

    @property
    def section_verdict(self) -> str:
        return "informational"


class Shape(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A section body's shape: every key `to_json` writes is required, and no other is taken."""


def field_error(e: msgspec.ValidationError) -> str:
    """msgspec's "Expected `str`, got `int` - at `$.prompts[0].id`" as "field prompts[0].id: ..."."""
    text, sep, where = str(e).rpartition(" - at `")
    if not sep:
        return str(e)
    if where.startswith("key` in `"):  # a mapping's key: "... - at `key` in `$.a.b`"
        where, text = where.removeprefix("key` in `"), f"a key: {text}"
    field = where.rstrip("`").removeprefix("$").removeprefix(".")
    return f"field {field or '(top level)'}: {text}"


def read_section(body: object, shape: type[T], name: str) -> T:
    """report.json's `name` section read into `shape`; InputError naming the section and field."""
    try:
        return msgspec.convert(body, shape)
    except msgspec.ValidationError as e:
        raise InputError(f"report.json's {name}: {field_error(e)}") from None


__all__ = ["Informational", "Shape", "field_error", "read_section"]


class UndeclaredField(RuntimeError):
    """A writer built what a declared shape does not declare: a bug in strict-gate, refused
    before anything reaches a file."""


def written(obj: Any, shape: type[T], where: str = "report.json") -> T:
    """`obj` (what a writer built) as `shape` declares it; UndeclaredField naming the first key the
    shape does not declare, a value its type refuses, or a value that does not read back equal."""
    try:
        doc = msgspec.convert(obj, shape)
    except msgspec.ValidationError as e:
        raise UndeclaredField(f"{where}: {field_error(e)}") from None
    _same(obj, doc, where)
    return doc


def _same(wrote: Any, holds: Any, at: str) -> None:
    """Every key and value written is one the declared shape holds (a field the shape has and the
    writer left out is a default: a field older reports lack)."""
    if isinstance(wrote, dict):
        if isinstance(holds, msgspec.Struct):
            held = {f: getattr(holds, f) for f in holds.__struct_fields__}
        elif isinstance(holds, dict):
            held = {str(k): v for k, v in holds.items()}
        else:
            raise UndeclaredField(f"{at}: an object where the schema holds {type(holds).__name__}")
        for k, v in wrote.items():
            if str(k) not in held:
                raise UndeclaredField(f"{at}.{k}: written but not declared in the schema")
            _same(v, held[str(k)], f"{at}.{k}")
    elif isinstance(wrote, (list, tuple)):
        if not isinstance(holds, (list, tuple)) or len(holds) != len(wrote):
            raise UndeclaredField(f"{at}: a list the schema does not hold whole")
        for i, (a, b) in enumerate(zip(wrote, holds, strict=True)):
            _same(a, b, f"{at}[{i}]")
    elif wrote != holds:
        raise UndeclaredField(f"{at}: written {wrote!r}, the schema holds {holds!r}")
