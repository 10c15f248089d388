"""Activations of a transformers model at the canonical points, through forward hooks.

The canonical names are transformers' own module paths (docs/localize.md): `embed` is
`model.embed_tokens`, `layers.{i}` decoder layer i's output (the residual stream),
`layers.{i}.attn` its `self_attn` output before the residual add, `layers.{i}.mlp` its `mlp`
output, `norm` the final norm, `logits` the head's output. Grafting (engines/torch_graft.py)
feeds the reference's layer inputs and, at ops, the reference's op values in place of the
model's own, so a point then carries only its own error. torch is imported by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from strict_gate.engines.base import DumpReply, DumpRequest
from strict_gate.engines.torch_graft import graft_hooks
from strict_gate.errors import EngineError


def _first(out: Any) -> Any:
    """A module's hidden states: attention blocks return (hidden, weights), layers a tensor."""
    return out[0] if isinstance(out, (tuple, list)) else out


def named_modules(model: Any) -> dict[str, Any]:
    """Canonical point -> module, for a *ForCausalLM whose decoder is `model.model`."""
    return decoder_modules(model.get_decoder() if hasattr(model, "get_decoder") else model.model)


def decoder_modules(base: Any) -> dict[str, Any]:
    """Canonical point -> module of a Llama-style decoder (transformers' and vLLM's share the names)."""
    found = {"embed": base.embed_tokens}
    for i, layer in enumerate(base.layers):
        found[f"layers.{i}"] = layer
        for point, attr in (("attn", "self_attn"), ("mlp", "mlp")):
            if hasattr(layer, attr):
                found[f"layers.{i}.{point}"] = getattr(layer, attr)
    if getattr(base, "norm", None) is not None:
        found["norm"] = base.norm
    return found


# Points inside a layer (localize/points.OPS): (attribute path from the layer, read its input?)
# An input is read where the point is what a projection is fed: the attention's output before
# o_proj (`core`), the MLP's activated product before down_proj (`act`).
_OPS = {"attn_norm": ("input_layernorm", False), "attn.q_proj": ("self_attn.q_proj", False),
        "attn.k_proj": ("self_attn.k_proj", False), "attn.v_proj": ("self_attn.v_proj", False),
        "attn.core": ("self_attn.o_proj", True), "attn.o_proj": ("self_attn.o_proj", False),
        "mlp_norm": ("post_attention_layernorm", False), "mlp.gate_proj": ("mlp.gate_proj", False),
        "mlp.up_proj": ("mlp.up_proj", False), "mlp.act": ("mlp.down_proj", True),
        "mlp.down_proj": ("mlp.down_proj", False), "attn.forget": ("self_attn.forget_gate", False),
        "attn.beta_proj": ("self_attn.b_proj", False), "attn.kda": ("self_attn.o_norm", True),
        "mlp.shared.down_proj": ("mlp.shared_experts.down_proj", False),
        "attn.kv_a_proj": ("self_attn.kv_a_proj_with_mqa", False), "attn.kv_a_norm": ("self_attn.kv_a_layernorm", False)}
# The other ops (rotary, MLA's expansion, the router, the routed experts) come from torch_taps.


def op_modules(model: Any) -> dict[str, tuple[Any, bool]]:
    """Canonical op point -> (module, read its input), for every op this decoder has."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    found = {}
    for i, layer in enumerate(base.layers):
        for op, (attr, takes_input) in _OPS.items():
            module = layer
            for part in attr.split("."):
                module = getattr(module, part, None)
            if module is not None:
                found[f"layers.{i}.{op}"] = (module, takes_input)
    return found


def module_device(module: Any) -> Any:
    return next(module.parameters()).device


def dump_hf_model(torch: Any, model: Any, request: DumpRequest, name: str = "activations") -> DumpReply:
    """Hooks at the points asked for over request.token_ids: one forward pass, or (decode_from)
    a prefill of the first ids then one id at a time through the model's cache (past key
    values, a recurrent state: the path generate takes). The kept positions go to
    <directory>/<name>.safetensors as float32 CPU tensors."""
    from safetensors.torch import save_file

    from strict_gate.engines.torch_taps import Taps, drop_unchosen, family

    modules, ops = named_modules(model), op_modules(model)
    every = [*modules, "logits"]
    rows: dict[str, list] = {}
    taps = Taps(torch, (model.get_decoder() if hasattr(model, "get_decoder") else model.model).layers, rows)
    tapped = taps.points()
    wanted = [p for p in (request.points or every) if p in every or p in ops or p in tapped]
    hooks = []

    def keep(point: str) -> Callable:
        def hook(module, args, out):
            rows.setdefault(point, []).append(_first(out)[0].flatten(1).float().cpu())  # heads: one row

        return hook

    def keep_input(point: str) -> Callable:
        def pre(module, args):
            rows.setdefault(point, []).append(args[0][0].flatten(1).float().cpu())

        return pre

    for point in wanted:
        if point in modules:
            hooks.append(modules[point].register_forward_hook(keep(point)))
        elif point in ops:
            module, takes_input = ops[point]
            hooks.append(module.register_forward_pre_hook(keep_input(point)) if takes_input
                         else module.register_forward_hook(keep(point)))
    if request.graft is not None:  # after the dump's hooks: a dumped point stays the model's own
        hooks += graft_hooks(request.graft, len(request.token_ids), modules, ops)
    taps.install(set(wanted) & tapped)
    try:
        with torch.inference_mode():
            for logits in _passes(torch, model, request):
                if "logits" in wanted:
                    rows.setdefault("logits", []).append(logits[0].float().cpu())
    finally:
        for h in hooks:
            h.remove()
        taps.remove()
    pos = torch.tensor(list(request.positions), dtype=torch.long)
    captured = drop_unchosen({p: torch.cat(r, 0).index_select(0, pos).contiguous() for p, r in rows.items()
                              if p in wanted or family(p) in wanted})
    path = Path(request.directory) / f"{name}.safetensors"
    save_file(captured, str(path))
    return DumpReply(path=path, points=tuple(sorted(captured)))


def _passes(torch: Any, model: Any, request: DumpRequest):
    """The forward passes of a dump, each yielding its logits: one over every id, or a prefill of
    the first `decode_from` ids and then one pass per id with the cache the prefill left."""
    device, ids = module_device(model), list(request.token_ids)
    n0 = request.decode_from
    if n0 is None:
        yield model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
        return
    if not 1 <= n0 <= len(ids):
        raise EngineError(f"hf: decode_from {n0} is outside 1..{len(ids)} (the ids sent)")
    out = model(input_ids=torch.tensor([ids[:n0]], device=device), use_cache=True)
    yield out.logits
    cache = out.past_key_values
    for t in ids[n0:]:
        out = model(input_ids=torch.tensor([[t]], device=device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        yield out.logits
