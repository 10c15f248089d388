"""vLLM's outputs read into the gate's records: decode steps and teacher-forced scores.

Decode steps carry up to k+1 logprob entries (the sampled token is always added);
prompt_logprobs[j] is the distribution at position j given ids[:j] (entry 0 is None), and
holds the top-k plus the actual token.
"""

from __future__ import annotations

from collections.abc import Sequence

from strict_gate.engines.base import PromptInput
from strict_gate.errors import EngineError
from strict_gate.runs.records import FINISH_REASONS, Record, ScoredStep, Timing, sort_topk


def _ttft(out) -> float | None:
    m = getattr(out, "metrics", None)
    v = getattr(m, "first_token_latency", None) if m is not None else None
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def output_record(p: PromptInput, out, total: float | None) -> Record:
    """One vLLM RequestOutput as a run record; anything vLLM left out is the record's error."""
    prompt_ids = tuple(int(t) for t in (out.prompt_token_ids or p.token_ids))
    timing = Timing(ttft_s=_ttft(out), total_s=total)
    if not out.outputs:
        return Record(id=p.id, prompt_token_ids=prompt_ids, error="vllm returned no completion", timing=timing)
    c = out.outputs[0]
    toks = tuple(int(t) for t in c.token_ids)
    if c.finish_reason not in FINISH_REASONS:
        return Record(
            id=p.id,
            prompt_token_ids=prompt_ids,
            token_ids=toks,
            error=f"vllm finished with reason {c.finish_reason!r} ({c.stop_reason!r})",
            timing=timing,
        )
    if c.logprobs is None or len(c.logprobs) != len(toks):
        return Record(
            id=p.id,
            prompt_token_ids=prompt_ids,
            token_ids=toks,
            error=f"vllm returned {0 if c.logprobs is None else len(c.logprobs)} logprob steps "
            f"for {len(toks)} tokens",
            timing=timing,
        )
    top = tuple(sort_topk((t, lp.logprob) for t, lp in step.items()) for step in c.logprobs)
    return Record(
        id=p.id,
        prompt_token_ids=prompt_ids,
        token_ids=toks,
        finish_reason=c.finish_reason,
        top_logprobs=top,
        timing=timing,
    )


def scored_steps(plp, n: int, continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
    """Continuation token i sits at position n + i; `top` keeps the top-k only (the actual token
    is in it when its rank is <= k), `logprob` is the actual token's."""
    steps = []
    for i, tok in enumerate(continuation_ids):
        d = plp[n + i]
        if d is None:
            raise EngineError(f"vllm: no prompt logprobs at position {n + i}")
        actual = d.get(int(tok))
        pairs = []
        for t, lp in d.items():
            if t == tok and len(d) > k and (lp.rank is None or lp.rank > k):
                continue  # the actual token, added beyond the top-k
            pairs.append((t, lp.logprob))
        steps.append(
            ScoredStep(
                token_id=int(tok),
                logprob=None if actual is None else float(actual.logprob),
                top=sort_topk(pairs)[:k] if k > 0 else (),
            )
        )
    return steps
