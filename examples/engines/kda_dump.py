"""The `dump` op of the KDA example engine (kda_engine.py; docs/engine-protocol.md, docs/localize.md).

One forward pass over the ids (or, mode "decode", a prefill and then one id at a time through
the cache: the recurrent state and the MLA cache), with torch hooks at the canonical points, the
asked positions kept as float32 in one safetensors file inside req["directory"]. `graft` names
a safetensors file of the reference's layer inputs: layer i is fed `embed` (i = 0) or
`layers.{i-1}` instead of its own input; and of op points ("graft_ops"), each fed where the next
op reads it, along either path (each feed hands out its rows pass by pass).

The points inside a layer (docs/localize.md, "Points inside a layer"): forward hooks on the
submodules in OPS, and taps for what a module's output does not give alone:
- `attn.kv_b_proj` (MLA): kv_b_proj expands the whole cached latent on a decode step; only the
  rows of this pass's tokens are kept.
- `mlp.router`, `mlp.experts.chosen`: the router returns (logits, weights, expert ids); the ids
  are kept sorted ascending per token, as floats.
- `mlp.experts.E.down_proj`: transformers runs the routed experts as one grouped matmul; the
  down projection's call is wrapped and its rows (sorted by expert) given back to their tokens,
  then checked to add up, with the routing weights, to the experts' output. Rows of tokens that
  did not choose E are zeros; an expert no kept position chose is not given. `mlp.experts` is
  the routed experts' weighted sum, before the shared expert is added.
Kimi-Linear's MLA applies no rotary (NoPE), so there is no `attn.q_rope` / `attn.k_rope` here.
"""

from __future__ import annotations

import re
from pathlib import Path

# point -> (submodule of the decoder layer, read its input rather than its output)
OPS = {"attn_norm": ("input_layernorm", False), "attn.q_proj": ("self_attn.q_proj", False),
       "attn.k_proj": ("self_attn.k_proj", False), "attn.v_proj": ("self_attn.v_proj", False),
       "attn.kv_a_proj": ("self_attn.kv_a_proj_with_mqa", False), "attn.kv_a_norm": ("self_attn.kv_a_layernorm", False),
       "attn.forget": ("self_attn.forget_gate", False), "attn.beta_proj": ("self_attn.b_proj", False),
       "attn.kda": ("self_attn.o_norm", True), "attn.core": ("self_attn.o_proj", True),
       "attn.o_proj": ("self_attn.o_proj", False), "mlp_norm": ("post_attention_layernorm", False),
       "mlp.gate_proj": ("mlp.gate_proj", False), "mlp.up_proj": ("mlp.up_proj", False),
       "mlp.act": ("mlp.down_proj", True), "mlp.down_proj": ("mlp.down_proj", False),
       "mlp.experts": ("mlp.experts", False), "mlp.shared.down_proj": ("mlp.shared_experts.down_proj", False)}
EXPERTS = "mlp.experts.down_proj"  # the family that asks for every mlp.experts.E.down_proj
EXPERT = re.compile(r"^layers\.([0-9]+)\.mlp\.experts\.[0-9]+\.down_proj$")


class Rows:
    """The graft file's rows of one point, handed out pass by pass: a prefill takes its rows, each
    decode step the next one (grafting along either path)."""

    def __init__(self, tensor):
        self.tensor, self.at = tensor, 0

    def next(self, like):
        n = like.shape[1]
        rows = self.tensor[self.at:self.at + n]
        self.at += n
        return rows.to(dtype=like.dtype, device=like.device).reshape(like.shape)


def feeder(rows):
    """A forward pre-hook that replaces a decoder layer's input (grafting)."""
    def feed(module, args, kwargs):
        if args:
            return (rows.next(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": rows.next(kwargs["hidden_states"])}
    return feed


def input_feeder(rows):
    """A forward pre-hook that replaces an op's input (`attn.core`, `mlp.act`, `attn.kda`)."""
    def feed(module, args):
        return (rows.next(args[0]), *args[1:])
    return feed


def output_feeder(rows):
    """A forward hook that replaces an op's output where the next op reads it."""
    def feed(module, args, out):
        return (rows.next(out[0]), *out[1:]) if isinstance(out, tuple) else rows.next(out)
    return feed


def asked(name, wanted):
    m = EXPERT.match(name)
    return name in wanted or (m is not None and f"layers.{m.group(1)}.{EXPERTS}" in wanted)


class Dump:
    """One dump request's hooks and rows."""

    def __init__(self, engine, req):
        self.engine, self.torch, self.req = engine, engine.torch, req
        self.rows, self.hooks, self.restore = {}, [], []
        self.tokens = 0  # the number of ids of the forward pass running now
        self.down = {}  # id(experts.down_proj) -> its grouped output of this pass
        self.downs = {id(layer.mlp.experts.down_proj) for layer in engine.model.model.layers
                      if hasattr(layer.mlp, "experts")}

    def keep(self, name, x):
        self.rows.setdefault(name, []).append(x.float())

    def output(self, name):
        def hook(module, args, out):
            x = out[0] if isinstance(out, tuple) else out
            self.keep(name, x[0].flatten(1) if x.dim() >= 3 else x)  # each call's rows, heads flattened
        return hook

    def input(self, name):
        def pre(module, args):
            self.keep(name, args[0][0].flatten(1))
        return pre

    def new_rows(self, name):
        def hook(module, args, out):  # (1, 1, cached + new, width): this pass's tokens only
            self.keep(name, out.reshape(-1, out.shape[-2], out.shape[-1])[0, -self.tokens:])
        return hook

    def router(self, i, wanted):
        def hook(module, args, out):
            logits, _, ids = out
            if f"layers.{i}.mlp.router" in wanted:
                self.keep(f"layers.{i}.mlp.router", logits.reshape(-1, logits.shape[-1]))
            if f"layers.{i}.mlp.experts.chosen" in wanted:
                self.keep(f"layers.{i}.mlp.experts.chosen", self.torch.sort(ids.reshape(-1, ids.shape[-1]), -1)[0])
        return hook

    def experts(self, i):
        def hook(module, args, out):
            proj = self.down.pop(id(module.down_proj), None)
            if proj is None:
                return
            torch, ids, weights = self.torch, args[1], args[2].float()
            sorted_ids, perm = torch.sort(ids.reshape(-1))  # the order the grouped matmul ran its rows in
            token, total = perm // ids.shape[-1], torch.zeros(out.shape, dtype=torch.float32)
            for e in range(module.down_proj.shape[0]):
                rows = torch.zeros(out.shape, dtype=torch.float32)
                rows[token[sorted_ids == e]] = proj[sorted_ids == e].float()
                total += rows * (weights * (ids == e)).sum(-1, keepdim=True)
                self.keep(f"layers.{i}.mlp.experts.{e}.down_proj", rows)
            if not torch.allclose(total, out.float(), rtol=2e-2, atol=2e-2 * float(out.abs().max()) + 1e-6):
                raise RuntimeError(f"layer {i}: the per-expert rows do not add up to the experts' output")
        return hook

    def install(self, wanted, modules, inputs, base):
        for name in wanted:
            if name in modules:
                self.hooks.append(modules[name].register_forward_hook(self.output(name)))
            elif name in inputs:
                self.hooks.append(inputs[name].register_forward_pre_hook(self.input(name)))
        for i, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if f"layers.{i}.attn.kv_b_proj" in wanted and hasattr(attn, "kv_b_proj"):
                self.hooks.append(attn.kv_b_proj.register_forward_hook(self.new_rows(f"layers.{i}.attn.kv_b_proj")))
            if hasattr(mlp, "gate") and ({f"layers.{i}.mlp.router", f"layers.{i}.mlp.experts.chosen"} & wanted):
                self.hooks.append(mlp.gate.register_forward_hook(self.router(i, wanted)))
            if hasattr(mlp, "experts") and f"layers.{i}.{EXPERTS}" in wanted:
                self.hooks.append(mlp.experts.register_forward_hook(self.experts(i)))
        if any(w.endswith(EXPERTS) for w in wanted):
            self.wrap_grouped()

    def wrap_grouped(self):
        from transformers.integrations import moe

        original = moe._grouped_linear

        def grouped(input, weight, offs, *args, **kwargs):
            out = original(input, weight, offs, *args, **kwargs)
            if id(weight) in self.downs:  # a down projection (gate_up_proj is the other grouped call)
                self.down[id(weight)] = out
            return out

        moe._grouped_linear = grouped
        self.restore.append(lambda: setattr(moe, "_grouped_linear", original))

    def remove(self):
        for h in self.hooks:
            h.remove()
        for undo in self.restore:
            undo()


def dump(engine, req):
    """The `dump` op: see the module docstring."""
    from safetensors.torch import load_file, save_file

    torch = engine.torch
    ids, positions = req.get("prompt_token_ids"), req.get("positions")
    engine._check_ids(ids, "prompt_token_ids")
    if not isinstance(positions, list) or not all(isinstance(p, int) and 0 <= p < len(ids) for p in positions):
        raise ValueError("positions must be a list of indices into prompt_token_ids")
    base = engine.model.model
    modules = {"embed": base.embed_tokens}
    for i, layer in enumerate(base.layers):
        modules |= {f"layers.{i}.attn": layer.self_attn, f"layers.{i}.mlp": layer.mlp, f"layers.{i}": layer}
    modules["norm"] = base.norm
    inputs = {}  # points read as a module's input (the name docs/localize.md gives them)
    op_inputs, op_outputs = {}, {}  # the same, ops only: what a graft may feed
    for i, layer in enumerate(base.layers):
        for op, (attr, takes_input) in OPS.items():
            module = layer
            for part in attr.split("."):
                module = getattr(module, part, None)
            if module is not None:
                (inputs if takes_input else modules)[f"layers.{i}.{op}"] = module
                (op_inputs if takes_input else op_outputs)[f"layers.{i}.{op}"] = module
    wanted = set(req.get("points") or [*(m for m in modules if m.count(".") < 3 and "_norm" not in m), "logits"])
    decode = req.get("mode") == "decode"
    if decode and (not isinstance(req.get("decode_from"), int) or not 1 <= req["decode_from"] <= len(ids)):
        raise ValueError("a decode dump needs decode_from in 1..len(prompt_token_ids)")
    d = Dump(engine, req)
    d.install(wanted, modules, inputs, base)
    if req.get("graft"):  # after the dump's hooks: a dumped point stays this model's own
        feeds = load_file(req["graft"])
        for i, layer in enumerate(base.layers):
            source = feeds.get("embed" if i == 0 else f"layers.{i - 1}")
            if source is not None:
                d.hooks.append(layer.register_forward_pre_hook(feeder(Rows(source)), with_kwargs=True))
        for name, source in feeds.items():  # graft_ops: an op's value, where the next op reads it
            if name in op_inputs:
                d.hooks.append(op_inputs[name].register_forward_pre_hook(input_feeder(Rows(source))))
            elif name in op_outputs:
                d.hooks.append(op_outputs[name].register_forward_hook(output_feeder(Rows(source))))
    try:
        with torch.inference_mode():
            for logits in passes(engine, d, ids, req["decode_from"] if decode else None):
                d.keep("logits", logits[0])
    finally:
        d.remove()
    pos = torch.tensor(positions, dtype=torch.long)
    kept = {name: torch.cat(r, 0).index_select(0, pos).contiguous() for name, r in d.rows.items()
            if asked(name, wanted)}
    kept = {name: t for name, t in kept.items() if not EXPERT.match(name) or bool(t.any())}  # unchosen: not given
    path = Path(req["directory"]) / "activations.safetensors"
    save_file(kept, str(path))
    return {"id": req["id"], "path": str(path), "points": sorted(kept)}


def passes(engine, d, ids, n0):
    """The forward passes, each yielding its logits: one over every id, or the decode path
    generate takes: a prefill of ids[:n0] (chunk or recurrent, as KDA_CHUNK_PREFILL says), then
    one id at a time through the cache (the recurrent state)."""
    from transformers import DynamicCache

    torch = engine.torch
    if n0 is None:
        d.tokens = len(ids)
        yield engine.model(input_ids=torch.tensor([ids])).logits
        return
    cache = DynamicCache(config=engine.config)
    d.tokens = n0
    yield engine.model(input_ids=torch.tensor([ids[:n0]]), past_key_values=cache, use_cache=True).logits
    d.tokens = 1
    for t in ids[n0:]:
        yield engine.model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True).logits
