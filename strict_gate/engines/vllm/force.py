"""A vLLM v1 logits processor that forces given ids, for the decode-path dump (docs/localize.md).

vLLM samples its own next token; to run given ids through its decode path (its KV cache, its
decode kernels), a request carrying `SamplingParams(extra_args={FORCE: [ids...]})` gets every
logit but the next forced id set to -inf at each sampling step, so greedy sampling picks it and
the next step feeds it through the decode path. The step is the number of tokens the request has
generated so far (`output_tok_ids`, a live reference vLLM keeps up to date), so a partial prefill
chunk, whose sample vLLM discards, forces the first id again. Past the forced ids, and for
every request without them, logits pass through untouched. It is not argmax-invariant, so vLLM
applies it before greedy sampling; logprobs are computed from the raw logits before it. The raw
row of each step of a forced request is kept (RAW, one forced request at a time: the dump's)
for the dump's `logits`: what vLLM's decode path would have chosen there.

The class API (vllm 0.32, `vllm.v1.sample.logits_processor`): `__init__(vllm_config, device,
is_pin_memory)`, `is_argmax_invariant()`, `update_state(batch_update)` with `added` tuples
`(index, params, prompt_ids, output_ids)`, `removed` indices and `moved` (i, j, direction)
applied in that order, and `apply(logits)`. It is passed as `LLM(logits_processors=[...])`
(refused by vLLM together with speculative decoding), by its qualified name (dump.PROCESSOR),
which vLLM's engine core imports. This module imports vllm at its top: nothing imports it but
vLLM, in its own processes.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from strict_gate.engines.vllm.dump import FORCE

# In the worker process: each forced request's raw logits rows, by step (the number of tokens it
# had generated), taken before the mask; a partial prefill chunk's row is replaced by the last's.
RAW: dict[int, object] = {}


def _forced(params: Any, _prompt: Any, output: list[int]) -> tuple[list[int], list[int]] | None:
    ids = (params.extra_args or {}).get(FORCE) if params is not None else None
    return ([int(t) for t in ids], output) if ids else None


class ForceIds(LogitsProcessor):
    """Per batch row: (the forced ids, the request's live output ids); rows without ids absent."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the greedy token

    def update_state(self, batch_update: Any) -> None:
        process_dict_updates(self.rows, batch_update, _forced)

    def apply(self, logits: Any) -> Any:
        for index, (ids, output) in self.rows.items():
            step = len(output)
            RAW[step] = logits[index].detach().float().cpu().clone()
            if step < len(ids):
                keep = logits[index, ids[step]].clone()
                logits[index].fill_(float("-inf"))
                logits[index, ids[step]] = keep
        return logits
