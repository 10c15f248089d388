"""The canonical capture points and their order along the depth (docs/localize.md)."""

from __future__ import annotations

import re

from strict_gate.errors import InputError
from strict_gate.judge.localization import PointKind, kind_of

# Inside a layer, in depth order (docs/localize.md, "Points inside a layer"): the norms, the
# attention's projections (before rotary); MLA's compressed latent (`attn.kv_a_proj`), its norm
# and its expansion (`attn.kv_b_proj`); q and k after rotary (`attn.q_rope`, `attn.k_rope`);
# KDA's forget gate, beta projection and chunk or recurrent output (`attn.kda`); the output before
# o_proj (`core`) and o_proj; the MLP's gate and up projections, the activated product and
# down_proj; a MoE block's router logits, chosen experts, each routed expert's down projection
# (`mlp.experts.E.down_proj`, asked for as the family EXPERTS), the routed sum and the shared expert.
EXPERTS = "mlp.experts.down_proj"  # asks for every routed expert's down projection: mlp.experts.E.down_proj
OPS = ("attn_norm", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.kv_a_proj", "attn.kv_a_norm",
       "attn.kv_b_proj", "attn.q_rope", "attn.k_rope", "attn.forget", "attn.beta_proj", "attn.kda",
       "attn.core", "attn.o_proj", "attn", "mlp_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.act", "mlp.down_proj",
       "mlp.router", "mlp.experts.chosen", EXPERTS, "mlp.experts", "mlp.shared.down_proj", "mlp", "")
EXACT = ("mlp.experts.chosen",)  # ids, not activations: any difference is beyond (no tolerance)
_EXPERT = re.compile(r"^mlp\.experts\.(0|[1-9][0-9]{0,3})\.down_proj$")
_SUB = "|".join(re.escape(o) for o in OPS if o and o not in ("attn", "mlp")) + "|" + _EXPERT.pattern[1:-1]
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


def expert_of(name: str) -> int | None:
    """The routed expert a point is of (layers.N.mlp.experts.E.down_proj), else None."""
    m = _EXPERT.match(op_of(name)) if layer_of(name) is not None else None
    return int(m.group(1)) if m else None


def family_of(name: str) -> str:
    """The name that asks for a point: an expert's down projection is asked for by its family."""
    return f"layers.{layer_of(name)}.{EXPERTS}" if expert_of(name) is not None else name


def is_family(name: str) -> bool:
    """A name that asks for points (every routed expert of a layer) and names no tensor itself."""
    return layer_of(name) is not None and op_of(name) == EXPERTS


def is_exact(name: str) -> bool:
    """A point of ids compared exactly (the chosen experts), not within a rel_diff tolerance."""
    return layer_of(name) is not None and op_of(name) in EXACT


def is_op(name: str) -> bool:
    return layer_of(name) is not None and op_of(name) not in ("", "attn", "mlp")


def ops_of(layer: int) -> tuple[str, ...]:
    """Every point inside layer `layer`, in depth order (the narrowing pass asks for these)."""
    return tuple(f"layers.{layer}.{o}" if o else f"layers.{layer}" for o in OPS)


def depth_key(name: str) -> tuple[int, int, int]:
    """embed, then per layer its ops, attn, mlp and the layer's output (OPS; experts by number),
    then norm and logits."""
    if name == "embed":
        return (-1, 0, 0)
    if name.startswith("layers."):
        expert = expert_of(name)
        op = EXPERTS if expert is not None else op_of(name)
        return (layer_of(name) or 0, OPS.index(op), -1 if expert is None else expert)
    return (10**6, 0 if name == "norm" else 1, 0)


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
