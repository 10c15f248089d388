"""Grafting at ops: is an op beyond tolerance wrong on its own, or does it follow its input?

Inside the layer the narrowing pass looked into, the candidate dumps its ops once more with the
reference's values of that layer's op points fed in (the graft file, `graft_ops` in the hello):
each op then computes from the reference's inputs, so an op still beyond tolerance is wrong
alone, and one beyond only on its own inputs follows drift from earlier (torch.ao.ns's shadow
loggers make the same split). OP_INPUTS names what each op reads; an op not in it, or one whose
inputs either arm does not give, gets no verdict (never guessed). An engine that claims the
capability and ignores the graft gives back its own values where its inputs differed beyond
tolerance from the reference's: refused (`ignored`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strict_gate.judge.localization import Alone, PointDiff
from strict_gate.localize.points import layer_of, op_of

LAYER_INPUT = "<input>"  # the layer's input: `embed` for layer 0, `layers.{i-1}` after

# What each op reads, inside its layer (docs/localize.md, "Grafting at ops"). mlp_norm reads the
# residual: the layer's input plus the attention's output (o_proj, the attention block's last op).
OP_INPUTS: dict[str, tuple[str, ...]] = {
    "attn_norm": (LAYER_INPUT,),
    "attn.q_proj": ("attn_norm",), "attn.k_proj": ("attn_norm",), "attn.v_proj": ("attn_norm",),
    "attn.forget": ("attn_norm",), "attn.beta_proj": ("attn_norm",),
    "attn.kda": ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.forget", "attn.beta_proj"),
    "attn.core": ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.kda"),
    "attn.o_proj": ("attn.core",),
    "mlp_norm": (LAYER_INPUT, "attn.o_proj"),
    "mlp.gate_proj": ("mlp_norm",), "mlp.up_proj": ("mlp_norm",),
    "mlp.act": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.act",),
}
FEEDS = frozenset(i for inputs in OP_INPUTS.values() for i in inputs if i != LAYER_INPUT)


def layer_input(layer: int) -> str:
    return "embed" if layer == 0 else f"layers.{layer - 1}"


def inputs_of(op_point: str) -> tuple[str, ...]:
    """The points an op point reads, by name (empty: not an op this module knows)."""
    i = layer_of(op_point)
    if i is None:
        return ()
    return tuple(layer_input(i) if n == LAYER_INPUT else f"layers.{i}.{n}" for n in OP_INPUTS.get(op_of(op_point), ()))


def source_points(ops: tuple[str, ...]) -> tuple[str, ...]:
    """What the reference dumps (at every position) to graft the ops of some layers: the ops and
    each layer's input."""
    return (*(layer_input(i) for i in layers_of(ops)), *ops)


def layers_of(points) -> list[int]:
    return sorted({i for i in map(layer_of, points) if i is not None})


def write_graft(source: Mapping[str, Any], layers: list[int], path: Path) -> Path:
    """The graft file: the reference's input to each layer and the op points an op there reads,
    at every position."""
    from safetensors.torch import save_file

    wanted = {n for i in layers for n in (layer_input(i), *(f"layers.{i}.{f}" for f in FEEDS))}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in source.items() if n in wanted}, str(path))
    return path


def verdicts(ops: tuple[PointDiff, ...], grafted: tuple[PointDiff, ...], ref_gave: set[str], cand_gave: set[str]
             ) -> tuple[tuple[str, Alone], ...]:
    """Per op beyond on either curve, fed every input the reference gave (and the candidate gave
    too, so it could be fed): wrong alone when beyond on the reference's inputs, else following."""
    acc = {p.name: p for p in ops}
    out = []
    for g in grafted:
        inputs = [i for i in inputs_of(g.name) if i in ref_gave]
        a = acc.get(g.name)
        if not inputs or not set(inputs) <= cand_gave or g.rel_diff is None or a is None:
            continue
        if g.beyond:
            out.append((g.name, Alone.WRONG))
        elif a.beyond:
            out.append((g.name, Alone.FOLLOWS))
    return tuple(out)


def ignored(own: Mapping[str, Any], grafted: Mapping[str, Any], diffs: Mapping[str, PointDiff]) -> str | None:
    """Why the candidate's op graft reads as ignored, or None: an op whose input differs beyond
    tolerance from the reference's must come back changed when fed the reference's input; its
    own value, bit for bit, means the graft never reached it."""
    for name, value in grafted.items():
        mine = own.get(name)
        beyond = [i for i in inputs_of(name) if (d := diffs.get(i)) is not None and d.beyond]
        if mine is None or not beyond or tuple(mine.shape) != tuple(value.shape) or not bool((mine == value).all()):
            continue
        return (f"the candidate claims graft_ops but ignored the graft: {name} came back bit for bit its own value "
                f"when fed the reference's {', '.join(beyond)}, which differ{'s' if len(beyond) == 1 else ''} "
                "beyond tolerance from its own")
    return None
