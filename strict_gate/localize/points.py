"""The canonical capture points and their order along the depth (docs/localize.md)."""

from __future__ import annotations

import re

from strict_gate.errors import InputError
from strict_gate.judge.localization import PointKind, kind_of

# Inside a layer, in depth order (docs/localize.md, "Points inside a layer"): the norms, the
# attention's projections (before rotary), its output before o_proj (`core`) and o_proj, the
# MLP's gate and up projections, the activated product (down_proj's input) and down_proj.
# KDA blocks add their forget gate (`attn.forget`), beta projection (`attn.beta_proj`) and the chunk
# or recurrent output before its gated norm (`attn.kda`); a MoE block its shared expert's down
# projection (`mlp.shared.down_proj`).
OPS = ("attn_norm", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.forget", "attn.beta_proj", "attn.kda",
       "attn.core", "attn.o_proj", "attn", "mlp_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.act", "mlp.down_proj",
       "mlp.shared.down_proj", "mlp", "")
_SUB = "|".join(re.escape(o) for o in OPS if o and o not in ("attn", "mlp"))
_POINT = re.compile(r"^(embed|norm|logits|layers\.(0|[1-9][0-9]{0,4})(\.(attn|mlp|" + _SUB + "))?)$")
DEFAULT_POSITIONS = 8  # the divergence position and the 7 before it
LAYERS, OPS_DEPTH = "layers", "ops"  # --points: the layer-level points (default), or every op too


def is_point(name: str) -> bool:
    return bool(_POINT.match(name))


def layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def op_of(name: str) -> str:
    """What a layer point names inside its layer ("" for the layer's output)."""
    return name.split(".", 2)[2] if name.count(".") >= 2 else ""


def is_op(name: str) -> bool:
    return layer_of(name) is not None and op_of(name) not in ("", "attn", "mlp")


def ops_of(layer: int) -> tuple[str, ...]:
    """Every point inside layer `layer`, in depth order (the narrowing pass asks for these)."""
    return tuple(f"layers.{layer}.{o}" if o else f"layers.{layer}" for o in OPS)


def depth_key(name: str) -> tuple[int, int]:
    """embed, then per layer its ops, attn, mlp and the layer's output (OPS), then norm and logits."""
    if name == "embed":
        return (-1, 0)
    if name.startswith("layers."):
        return (layer_of(name) or 0, OPS.index(op_of(name)))
    return (10**6, 0 if name == "norm" else 1)


def in_depth_order(names) -> list[str]:
    return sorted(set(names), key=depth_key)


def parse_points(text: str | None, *, where: str = "--points") -> tuple[str, ...] | None:
    """A comma-separated list of point names; None (or empty, or "layers") asks for every
    layer-level point the engines give; "ops" for every op inside every layer as well."""
    if text is None or not text.strip() or text.strip() == LAYERS:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == [OPS_DEPTH]:
        return (OPS_DEPTH,)
    bad = [n for n in names if not is_point(n)]
    if bad:
        raise InputError(
            f"{where}: unknown point name(s) {', '.join(map(repr, bad))}; the points are embed, layers.N, "
            "layers.N.attn, layers.N.mlp, their ops (layers.N.attn.q_proj, ... docs/localize.md), norm, logits; "
            f"or {LAYERS!r} (the default) or {OPS_DEPTH!r} for a depth of detail"
        )
    return tuple(in_depth_order(names))


def layer_inputs(points) -> list[str]:
    """What a graft file holds: the input of every layer (embed and every layer's output)."""
    return [p for p in points if p == "embed" or kind_of(p) == PointKind.LAYER]
