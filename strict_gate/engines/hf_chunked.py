"""hf's chunked prefill: the prompt fed `chunk` tokens at a time through the model and its cache,
then a greedy decode one token at a time, as a serving engine splits a long prefill.

transformers' generate() has no chunked prefill, so this is the loop by hand: each chunk a forward
with the cache the previous one returned (for a linear-attention model, Kimi-Linear's KDA layers
say, the cache carries the recurrent and convolution state across the cut), the last chunk's final
logits the first step. The raw logits are read as generate() reads them (before any processor): an
`ignore_eos` run masks the end-of-sequence ids only when choosing, as min_new_tokens does.
Called from hf.py's engine after start(); torch is handed in, never imported here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from strict_gate.engines.base import PromptInput, greedy_finish_reason
from strict_gate.runs.records import Record, Sampling, Timing, sort_topk


def chunked_record(torch: Any, model: Any, p: PromptInput, sampling: Sampling, chunk: int, eos: set[int]) -> Record:
    """One prompt prefilled `chunk` tokens per forward, then decoded: its record, or its error."""
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            logits, cache = _prefill(torch, model, p.token_ids, chunk)
            first = time.perf_counter()
            toks, steps = _decode(torch, model, logits, cache, sampling, eos)
    except Exception as e:  # a forward failure is this prompt's, not the gate's
        return Record(id=p.id, prompt_token_ids=p.token_ids, error=f"{type(e).__name__}: {e}")
    return Record(id=p.id, prompt_token_ids=p.token_ids, token_ids=tuple(toks),
                  finish_reason=greedy_finish_reason(toks, eos), top_logprobs=tuple(steps),
                  timing=Timing(ttft_s=first - t0, total_s=time.perf_counter() - t0))


def _prefill(torch: Any, model: Any, ids: Sequence[int], chunk: int) -> tuple[Any, Any]:
    """The last position's logits after every chunk went through, and the cache they left."""
    cache, out = None, None
    for s in range(0, len(ids), chunk):
        piece = torch.tensor([list(ids[s : s + chunk])], device=model.device)
        out = model(input_ids=piece, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    assert out is not None  # a prompt has a token
    return out.logits[0, -1], cache


def _decode(torch: Any, model: Any, logits: Any, cache: Any, sampling: Sampling, eos: set[int]
            ) -> tuple[list[int], list]:
    """Greedy tokens from `logits` on, each fed back with the cache; each step's top-k from the raw logits."""
    toks: list[int] = []
    steps = []
    masked = sorted(eos)
    for n in range(sampling.max_tokens):
        lps = torch.log_softmax(logits.float(), dim=-1)
        choose = logits.clone()
        if sampling.ignore_eos and masked:
            choose[masked] = float("-inf")
        tok = int(choose.argmax())
        toks.append(tok)
        steps.append(_step(torch, lps, tok, sampling.top_logprobs))
        if (tok in eos and not sampling.ignore_eos) or n + 1 == sampling.max_tokens:
            break
        out = model(input_ids=torch.tensor([[tok]], device=model.device), past_key_values=cache, use_cache=True)
        logits, cache = out.logits[0, -1], out.past_key_values
    return toks, steps


def _step(torch: Any, lps: Any, tok: int, k: int) -> tuple:
    """The step's top-k (the chosen token added where it is not among them), as hf.py writes it."""
    if k <= 0:
        return sort_topk([(tok, float(lps[tok]))])
    top = torch.topk(lps, k)
    pairs = list(zip(top.indices.tolist(), top.values.tolist()))
    if tok not in top.indices.tolist():
        pairs.append((tok, float(lps[tok])))
    return sort_topk(pairs)
