#!/usr/bin/env python
"""Does the prefix-cache variant hit vLLM's cache? (benchmarks/README.md, "Invariance")

    python benchmarks/vllm_prefix_hits.py [--block-size 32] [--dtype float32]

Serves each battery-128 prompt the way the prefix_cache variant does (all its ids but the last,
then the prompt) on the vLLM arm of gates/invariance-vllm.toml, and counts the prompt tokens
vLLM reports as served from the cache (RequestOutput.num_cached_tokens) on the second request.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    model = str(ROOT / "strict_gate" / "models" / "tiny-llama")
    tok = AutoTokenizer.from_pretrained(model)
    prompts = []
    for line in (ROOT / "prompts" / "battery-128.jsonl").read_text().splitlines():
        d = json.loads(line)
        prompts.append(d.get("token_ids") or tok(d["text"]).input_ids)
    llm = LLM(model=model, dtype=args.dtype, enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_model_len=512,
              seed=0, block_size=args.block_size)
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
    hits, tokens, eligible = 0, 0, 0
    for ids in prompts:
        llm.generate([{"prompt_token_ids": ids[:-1] or ids}], params, use_tqdm=False)
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        n = out.num_cached_tokens or 0
        eligible += (len(ids) - 1) >= args.block_size
        hits += n > 0
        tokens += n
    total = sum(len(p) for p in prompts)
    print(f"block_size {args.block_size}: {hits}/{len(prompts)} prompts served part of their prefix from the cache "
          f"({eligible} have at least one full block before their last token); {tokens}/{total} prompt tokens cached")


if __name__ == "__main__":
    main()
