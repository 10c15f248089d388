"""The canonical capture points and their order along the depth (docs/localize.md)."""

from __future__ import annotations

import re

from strict_gate.errors import InputError
from strict_gate.judge.localization import PointKind, kind_of

_POINT = re.compile(r"^(embed|norm|logits|layers\.(0|[1-9][0-9]{0,4})(\.(attn|mlp))?)$")
DEFAULT_POSITIONS = 8  # the divergence position and the 7 before it


def is_point(name: str) -> bool:
    return bool(_POINT.match(name))


def layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def depth_key(name: str) -> tuple[int, int]:
    """embed, then per layer attn, mlp, the layer's output, then norm and logits."""
    if name == "embed":
        return (-1, 0)
    if name.startswith("layers."):
        sub = {PointKind.ATTN: 0, PointKind.MLP: 1, PointKind.LAYER: 2}[kind_of(name)]
        return (layer_of(name) or 0, sub)
    return (10**6, 0 if name == "norm" else 1)


def in_depth_order(names) -> list[str]:
    return sorted(set(names), key=depth_key)


def parse_points(text: str | None, *, where: str = "--points") -> tuple[str, ...] | None:
    """A comma-separated list of point names; None (or empty) asks for every point."""
    if text is None or not text.strip():
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not is_point(n)]
    if bad:
        raise InputError(
            f"{where}: unknown point name(s) {', '.join(map(repr, bad))}; the points are embed, layers.N, "
            "layers.N.attn, layers.N.mlp, norm, logits"
        )
    return tuple(in_depth_order(names))


def layer_inputs(points) -> list[str]:
    """What a graft file holds: the input of every layer (embed and every layer's output)."""
    return [p for p in points if p == "embed" or kind_of(p) == PointKind.LAYER]
