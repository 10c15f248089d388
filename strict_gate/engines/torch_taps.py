"""Points inside a layer that a forward hook on a module's output cannot give (docs/localize.md).

- `attn.q_rope`, `attn.k_rope`: transformers applies rotary with the module-level function
  `apply_rotary_pos_emb` inside the attention forward; during a dump that function is wrapped
  and its results kept, so the points are what the engine computed, not a recomputation.
- `attn.kv_b_proj` (MLA): kv_b_proj expands the cached latent, so a decode step's output holds
  every cached position; only the rows of the tokens of this pass are kept.
- `mlp.router`, `mlp.experts.chosen`: the router returns (logits, weights, expert ids) at once.
- `mlp.experts.E.down_proj`, `mlp.experts`: the routed experts run as one grouped matmul
  (transformers' default `grouped_mm`); its down projection is wrapped and its rows, sorted
  by expert, given back to their tokens with the same sort. They must add up, with the routing
  weights, to the experts' output, or the dump fails. Rows of tokens that did not choose E are
  zeros; an expert no kept position chose is not given. Other experts implementations give none.
torch is imported by the caller.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from strict_gate.errors import EngineError

# The names (localize/points.py holds the canonical list; engines may not import it).
EXPERTS = "mlp.experts.down_proj"  # asks for every routed expert's mlp.experts.E.down_proj
_EXPERT = re.compile(r"^layers\.([0-9]+)\.mlp\.experts\.[0-9]+\.down_proj$")
ROPE, KV_B, ROUTER, CHOSEN, ROUTED = "attn.q_rope", "attn.kv_b_proj", "mlp.router", "mlp.experts.chosen", "mlp.experts"


def _tokens(x: Any) -> Any:
    """(1, T, ...) or (T, ...) as (T, width): a batch of one, or tokens already flattened."""
    return x[0].flatten(1) if x.dim() >= 3 else x


class Taps:
    """Wrappers and hooks for the points above, over a decoder's layers; `rows` gathers each
    point's rows pass by pass (the dump's store)."""

    def __init__(self, torch: Any, layers: Any, rows: dict[str, list]):
        self.torch, self.layers, self.rows = torch, list(layers), rows
        self.current: tuple[int, int] | None = None  # (layer, tokens) of the attention running now
        self.undo: list[Callable[[], None]] = []
        self.down: dict[int, Any] = {}  # id(experts.down_proj) -> its grouped output of this pass
        self.wanted: set[str] = set()

    def points(self) -> set[str]:
        """Every point these taps can give on this decoder (experts asked for by family)."""
        out = set()
        for i, layer in enumerate(self.layers):
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if attn is not None and hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb"):
                out |= {f"layers.{i}.{ROPE}", f"layers.{i}.attn.k_rope"}
            if attn is not None and hasattr(attn, "kv_b_proj"):
                out.add(f"layers.{i}.{KV_B}")
            if _router(mlp) is not None:
                out |= {f"layers.{i}.{ROUTER}", f"layers.{i}.{CHOSEN}"}
            if _experts(mlp) is not None:
                out |= {f"layers.{i}.{EXPERTS}", f"layers.{i}.{ROUTED}"}
        return out

    def install(self, wanted: set[str]) -> None:
        self.wanted = wanted
        def want(i: int, op: str) -> bool:
            return f"layers.{i}.{op}" in wanted

        for i, layer in enumerate(self.layers):
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if attn is not None:
                self._hook(attn.register_forward_pre_hook(self._enter(i), with_kwargs=True))
            if want(i, KV_B) and attn is not None:
                self._hook(attn.kv_b_proj.register_forward_hook(self._keep_new(f"layers.{i}.{KV_B}")))
            if want(i, ROUTER) or want(i, CHOSEN):
                self._hook(_router(mlp).register_forward_hook(self._keep_router(i, wanted)))
            if want(i, EXPERTS) or want(i, ROUTED):
                self._hook(_experts(mlp).register_forward_hook(self._keep_experts(i, wanted)))
        if any(w.endswith((ROPE, "attn.k_rope")) for w in wanted):
            self._wrap_rope()
        if any(w.endswith(EXPERTS) for w in wanted):
            self._wrap_grouped()

    def remove(self) -> None:
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()

    def _hook(self, handle: Any) -> None:
        self.undo.append(handle.remove)

    def _keep(self, name: str, x: Any) -> None:
        self.rows.setdefault(name, []).append(x.float().cpu())

    def _enter(self, i: int) -> Callable:
        def pre(module, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            self.current = (i, x.shape[-2])

        return pre

    def _keep_new(self, name: str) -> Callable:
        def hook(module, args, out):
            n = self.current[1] if self.current else out.shape[-2]
            self._keep(name, out.reshape(-1, out.shape[-2], out.shape[-1])[0, -n:])  # this pass's tokens only

        return hook

    def _keep_router(self, i: int, wanted: set[str]) -> Callable:
        def hook(module, args, out):
            if not (isinstance(out, tuple) and len(out) == 3):
                raise EngineError(f"hf: layer {i}'s router returned {type(out).__name__}, not (logits, weights, ids)")
            logits, _, ids = out
            if f"layers.{i}.{ROUTER}" in wanted:
                self._keep(f"layers.{i}.{ROUTER}", logits.reshape(-1, logits.shape[-1]))
            if f"layers.{i}.{CHOSEN}" in wanted:  # ascending: the order topk lists them in is no choice
                self._keep(f"layers.{i}.{CHOSEN}", self.torch.sort(ids.reshape(-1, ids.shape[-1]), dim=-1)[0])

        return hook

    def _keep_experts(self, i: int, wanted: set[str]) -> Callable:
        def hook(module, args, out):
            routed = out.reshape(-1, out.shape[-1])
            if f"layers.{i}.{ROUTED}" in wanted:
                self._keep(f"layers.{i}.{ROUTED}", routed)
            proj = self.down.pop(id(module.down_proj), None)
            if f"layers.{i}.{EXPERTS}" in wanted and proj is not None:
                per = self._per_expert(i, module.down_proj.shape[0], args[1], args[2], proj, routed)
                for e, rows in enumerate(per):
                    self._keep(f"layers.{i}.mlp.experts.{e}.down_proj", rows)

        return hook

    def _per_expert(self, i: int, n: int, ids: Any, weights: Any, proj: Any, routed: Any) -> list:
        """Each expert's (tokens x hidden) rows of the grouped down projection, checked to add up."""
        torch = self.torch
        ids = ids.reshape(-1, ids.shape[-1])
        sorted_ids, perm = torch.sort(ids.reshape(-1))  # what grouped_mm_experts_forward sorts by
        token = perm // ids.shape[-1]
        out, total = [], torch.zeros(routed.shape, dtype=torch.float32)
        for e in range(n):
            rows = torch.zeros(routed.shape, dtype=torch.float32)
            rows[token[sorted_ids == e]] = proj[sorted_ids == e].float().cpu()
            weight = (weights.reshape(ids.shape).float() * (ids == e)).sum(-1, keepdim=True).cpu()
            total += rows * weight
            out.append(rows)
        want = routed.float().cpu()
        if not torch.allclose(total, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()) + 1e-6):
            raise EngineError(f"hf: layer {i}'s per-expert rows do not add up to its experts' output "
                              f"(max |Δ| {float((total - want).abs().max()):.3g}): the capture does not know "
                              "this experts implementation")
        return out

    def _wrap_rope(self) -> None:
        modules = {sys.modules[type(layer.self_attn).__module__] for layer in self.layers if hasattr(layer, "self_attn")}
        for module in (m for m in modules if hasattr(m, "apply_rotary_pos_emb")):
            original = vars(module)["apply_rotary_pos_emb"]

            def rope(q, k, *args, _original=original, **kwargs):
                q_embed, k_embed = _original(q, k, *args, **kwargs)
                if self.current is not None:
                    i = self.current[0]
                    for op, x in ((ROPE, q_embed), ("attn.k_rope", k_embed)):  # (1, heads, T, dim)
                        if f"layers.{i}.{op}" in self.wanted:
                            self._keep(f"layers.{i}.{op}", x[0].transpose(0, 1).flatten(1))
                return q_embed, k_embed

            self._patch(module, "apply_rotary_pos_emb", rope)

    def _wrap_grouped(self) -> None:
        from transformers.integrations import moe

        original = moe._grouped_linear
        downs = {id(_experts(getattr(layer, "mlp", None)).down_proj) for layer in self.layers
                 if _experts(getattr(layer, "mlp", None)) is not None}

        def grouped(input, weight, offs, *args, **kwargs):
            out = original(input, weight, offs, *args, **kwargs)
            if id(weight) in downs:
                self.down[id(weight)] = out
            return out

        self._patch(moe, "_grouped_linear", grouped)

    def _patch(self, module: Any, attr: str, new: Callable) -> None:
        """Replace a module-level function for the dump only; remove() puts it back."""
        original = getattr(module, attr)
        setattr(module, attr, new)
        self.undo.append(lambda: setattr(module, attr, original))


def _router(mlp: Any) -> Any:
    gate = getattr(mlp, "gate", None)
    return gate if gate is not None and hasattr(gate, "top_k") else None


def _experts(mlp: Any) -> Any:
    experts = getattr(mlp, "experts", None)
    down = getattr(experts, "down_proj", None)
    return experts if down is not None and getattr(down, "dim", lambda: 0)() == 3 else None


def family(name: str) -> str:
    """The name that asks for a point: an expert's down projection is asked for by its family."""
    m = _EXPERT.match(name)
    return f"layers.{m.group(1)}.{EXPERTS}" if m else name


def drop_unchosen(captured: dict[str, Any]) -> dict[str, Any]:
    """An expert no kept position chose has only zero rows: not given (a dump of zeros is refused)."""
    return {p: t for p, t in captured.items() if family(p) == p or bool(t.any())}
