"""Activations inside vLLM's worker, through `LLM.apply_model` (docs/localize.md).

Hooks are installed on the worker's model by a function sent with apply_model, one request
runs (prompt_logprobs on, so the prefix cache is never read and every prompt row is
computed), and a second function reads the rows back as CPU float32 tensors and removes the
hooks. Prefill: the ids are the prompt, one token is generated. Decode (`decode_from`): the
first ids are the prompt and the rest are forced one per step by the logits processor of
engines/vllm/force.py, then one token more, so every id is fed through vLLM's decode path (its
KV cache) one forward pass at a time; the forward passes' row counts are checked to be the
prompt (in chunks) then one row per step, and the generated tokens to be the ids given.
vLLM's decoder layers return (hidden_states, residual) with the residual add deferred into the
next layer's fused norm: the HF-equivalent layer output is their sum, and
`layers.{i}.mlp` is the first element alone. A module that returns None and fills the `output`
tensor it is handed (vLLM's Kimi-Linear attention, KDA and MLA alike) is read from that tensor.
Checked for Llama (LlamaDecoderLayer): embed =
embed_tokens, attn = self_attn, mlp = mlp, norm = model.norm (fused with the last residual
add: its first output is the normed hidden state). `logits`: vLLM computes logits only for the
sampled rows (and the prompt-logprob rows, through a separate call), so a prefill dump has none;
a decode dump has the raw rows the processor saw (before its mask) when every kept position is a
sampled row (the prompt's last or later).
Functions sent to the worker are pickled: they need VLLM_ALLOW_INSECURE_SERIALIZATION=1
in the environment before the engine starts (the vllm engine sets it when it starts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strict_gate.engines.base import DumpRequest
from strict_gate.engines.torch_dump import decoder_modules
from strict_gate.errors import EngineError

_STORE = "_strict_gate_dump"
_CALLS, _RAW = "_calls", "_raw."  # collect()'s keys beside the points
FORCE = "strict_gate_force"  # the SamplingParams.extra_args key the processor reads: the ids to force
PROCESSOR = "strict_gate.engines.vllm.force:ForceIds"  # LLM(logits_processors=[...]), by qualified name


def install(model: Any, points: list[str] | None) -> list[str]:
    """In the worker: hooks that append each forward call's rows per point, one that counts each
    call's rows (on `embed`, asked for or not), and no raw logits rows left from before."""
    _raw_rows().clear()
    store: dict[str, list] = {}
    calls: list[int] = []
    modules = decoder_modules(model.model)

    def keep(name: str):
        def hook(module, args, kwargs, out):
            if name.startswith("layers.") and name.count(".") == 1 and isinstance(out, tuple) and len(out) == 2 \
                    and out[1] is not None:
                x = out[0] + out[1]  # the split residual: HF's layer output is their sum
            elif out is None:  # written in place (Kimi-Linear's attention fills its `output` argument)
                x = kwargs.get("output")
                if x is None:  # nothing to read: the point stays empty and run() refuses the dump
                    return
            else:
                x = out[0] if isinstance(out, tuple) else out
            store.setdefault(name, []).append(x.detach().float().cpu().clone())

        return hook

    chosen = [p for p in (points or list(modules)) if p in modules]
    hooks = [modules[name].register_forward_hook(keep(name), with_kwargs=True) for name in chosen]
    hooks.append(modules["embed"].register_forward_hook(lambda m, a, out: calls.append(int(out.shape[0]))))
    setattr(model, _STORE, (store, calls, hooks))
    return chosen


def collect(model: Any) -> dict[str, Any]:
    """In the worker: the rows captured per point, concatenated over forward calls, and under
    `_CALLS` each call's row count, under `_RAW` + step the raw logits rows the forcing processor
    kept (when it is loaded); the hooks removed. One flat dict of tensors: what apply_model's
    serialiser carries back as tensors."""
    import torch

    store, calls, hooks = getattr(model, _STORE)
    for h in hooks:
        h.remove()
    delattr(model, _STORE)
    out = {name: torch.cat(rows, dim=0) for name, rows in store.items()}
    out[_CALLS] = torch.tensor(calls, dtype=torch.int64)
    raw = _raw_rows()
    out |= {f"{_RAW}{step}": row for step, row in raw.items()}
    raw.clear()
    return out


def _raw_rows() -> dict[int, Any]:
    """In the worker: the forcing processor's raw logits rows (empty where it is not loaded)."""
    import sys

    force = sys.modules.get(PROCESSOR.split(":")[0])
    return force.RAW if force is not None else {}


def run(llm: Any, request: DumpRequest) -> dict[str, Any]:
    """One dump request through `llm`: the kept rows per point (float32 CPU tensors)."""
    from functools import partial

    from vllm import SamplingParams

    ids, n0 = [int(t) for t in request.token_ids], request.decode_from
    if n0 is not None and not 1 <= n0 <= len(ids):
        raise EngineError(f"vllm: decode_from {n0} is outside 1..{len(ids)} (the ids sent)")
    if n0 is None:
        prompt, params = ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    else:  # the forced ids, then one token more: the last id is fed through a decode step too
        prompt, params = ids[:n0], SamplingParams(temperature=0.0, max_tokens=len(ids) - n0 + 1, ignore_eos=True,
                                                  prompt_logprobs=1, extra_args={FORCE: ids[n0:]})
    try:
        chosen = llm.apply_model(partial(install, points=list(request.points) if request.points else None))[0]
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        rows = llm.apply_model(collect)[0]
    except Exception as e:
        raise EngineError(f"vllm: dump failed: {type(e).__name__}: {e}") from None
    if empty := [p for p in chosen if p not in rows]:
        raise EngineError(f"vllm: dump of {', '.join(empty)}: no rows (the module returned nothing and was handed "
                          "no `output` tensor to fill, or it never ran)")
    calls = [int(n) for n in rows.pop(_CALLS).tolist()]
    raw = {int(k.removeprefix(_RAW)): rows.pop(k) for k in [k for k in rows if k.startswith(_RAW)]}
    kept = {}
    for name, t in rows.items():
        if t.shape[0] < len(ids):
            raise EngineError(f"vllm: dump of {name} holds {t.shape[0]} rows for {len(ids)} ids "
                              "(a cached prefix was not recomputed)")
        kept[name] = t[: len(ids)][list(request.positions)].contiguous()
    if n0 is not None:
        _check_decode(ids, n0, list(out.outputs[0].token_ids), calls)
        logits = _decode_logits(raw, n0, request.positions)
        if logits is not None and (request.points is None or "logits" in request.points):
            kept["logits"] = logits
    return kept


def _check_decode(ids: list[int], n0: int, generated: list[int], calls: list[int]) -> None:
    """The decode path was taken: the tokens generated are the ids forced, and after the prompt's
    forward passes every pass ran one row (one decode step per id)."""
    if generated[: len(ids) - n0] != ids[n0:]:
        raise EngineError(f"vllm: the decode-path dump generated {generated[: len(ids) - n0]} where the ids "
                          f"were {ids[n0:]}: the forcing logits processor did not hold")
    done, i = 0, 0
    while i < len(calls) and done < n0:
        done, i = done + calls[i], i + 1
    if done != n0 or calls[i:] != [1] * (len(ids) - n0):
        raise EngineError(f"vllm: the decode-path dump's forward passes ran {calls} rows for a prompt of {n0} "
                          f"and {len(ids) - n0} decode steps of one row each")


def _decode_logits(raw: dict[int, Any], n0: int, positions: Sequence[int]) -> Any:
    """The raw logits at the kept positions, when each is a sampled row (position n0 - 1 + step)."""
    import torch

    steps = [p - (n0 - 1) for p in positions]
    if not steps or min(steps) < 0 or any(s not in raw for s in steps):
        return None
    return torch.stack([raw[s] for s in steps]).contiguous()
