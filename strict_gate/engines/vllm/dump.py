"""Activations inside vLLM's worker, through `LLM.apply_model` (docs/localize.md).

Hooks are installed on the worker's model by a function sent with apply_model, one request
runs (prompt_logprobs on, so the prefix cache is never read and every prompt row is
computed), and a second function reads the rows back as CPU float32 tensors and removes the
hooks. vLLM's decoder layers return (hidden_states, residual) with the residual add deferred
into the next layer's fused norm: the HF-equivalent layer output is their sum, and
`layers.{i}.mlp` is the first element alone. Checked for Llama (LlamaDecoderLayer): embed =
embed_tokens, attn = self_attn, mlp = mlp, norm = model.norm (fused with the last residual
add: its first output is the normed hidden state). `logits` is absent: vLLM computes logits
only for the sampled rows and the prompt-logprob rows through separate calls.
Functions sent to the worker are pickled: they need VLLM_ALLOW_INSECURE_SERIALIZATION=1
in the environment before the engine starts (the vllm engine sets it when it starts).
"""

from __future__ import annotations

from typing import Any

from strict_gate.engines.torch_dump import decoder_modules

_STORE = "_strict_gate_dump"


def install(model: Any, points: list[str] | None) -> list[str]:
    """In the worker: hooks that append each forward call's rows per point."""
    store: dict[str, list] = {}
    hooks = []
    modules = decoder_modules(model.model)

    def keep(name: str):
        def hook(module, args, out):
            if name.startswith("layers.") and name.count(".") == 1 and isinstance(out, tuple) and len(out) == 2 \
                    and out[1] is not None:
                x = out[0] + out[1]  # the split residual: HF's layer output is their sum
            else:
                x = out[0] if isinstance(out, tuple) else out
            store.setdefault(name, []).append(x.detach().float().cpu().clone())

        return hook

    chosen = [p for p in (points or list(modules)) if p in modules]
    for name in chosen:
        hooks.append(modules[name].register_forward_hook(keep(name)))
    setattr(model, _STORE, (store, hooks))
    return chosen


def collect(model: Any) -> dict[str, Any]:
    """In the worker: the rows captured, concatenated over forward calls; the hooks removed."""
    import torch

    store, hooks = getattr(model, _STORE)
    for h in hooks:
        h.remove()
    delattr(model, _STORE)
    return {name: torch.cat(rows, dim=0) for name, rows in store.items()}
