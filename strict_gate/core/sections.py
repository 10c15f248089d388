"""What every feature's section shares: its result's informational default, the shape a loader
reads a report.json section into, and the one way it is read (core/features.py's `load`).

A section body is read strictly: every key the feature's `to_json` writes is required and no
other is taken (a key a rewrite would silently drop is refused), and a body that does not read is
an InputError naming the section and the field, never a traceback.
"""

from __future__ import annotations

from typing import TypeVar

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
    field = where.rstrip("`").removeprefix("$").removeprefix(".")
    return f"field {field or '(top level)'}: {text}"


def read_section(body: object, shape: type[T], name: str) -> T:
    """report.json's `name` section read into `shape`; InputError naming the section and field."""
    try:
        return msgspec.convert(body, shape)
    except msgspec.ValidationError as e:
        raise InputError(f"report.json's {name}: {field_error(e)}") from None


__all__ = ["Informational", "Shape", "field_error", "read_section"]
