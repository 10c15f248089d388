#!/usr/bin/env python
"""transformers' batch dependence on a GPU: batch 1 against left-padded batches of 8 and 32
(benchmarks/README.md, "The hf arm on the H200").

    python benchmarks/invariance_gpu.py

Plain transformers, no strict-gate import (the GPU machine it ran on had neither this branch
nor two of strict-gate's dependencies): for the bundled tiny-llama and a random-weight Llama of
Llama-3.2-1B's shape, in float32, bfloat16 and float16, the greedy tokens (16, stopping at EOS)
of prompts/battery-128.jsonl at batch 1, again at batch 1, and in groups of 8 and 32 through
one `generate` each with left padding and the attention mask (what strict-gate's hf engine
does for the `batch` variant); it prints how many prompts' tokens differ from the first
batch-1 run. This is the logic of the command run on the H200, spelled out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "strict_gate" / "models" / "tiny-llama"
ONE_B = Path("/tmp/m1b")
PAD, EOS = 3, 2


def one_b_shape() -> Path:
    tiny = LlamaConfig.from_pretrained(TINY)
    cfg = LlamaConfig(vocab_size=tiny.vocab_size, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(ONE_B)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(TINY / f, ONE_B / f)
    return ONE_B


def greedy(model, group: list[list[int]]) -> list[list[int]]:
    width = max(map(len, group))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in group]).cuda()
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group]).cuda()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                             pad_token_id=PAD, eos_token_id=EOS)
    seqs = []
    for row in out[:, width:].tolist():
        seq = []
        for t in row:
            seq.append(t)
            if t == EOS:
                break
        seqs.append(seq)
    return seqs


def main() -> None:
    tok = AutoTokenizer.from_pretrained(TINY)
    prompts = []
    for line in (ROOT / "prompts" / "battery-128.jsonl").read_text().splitlines():
        d = json.loads(line)
        prompts.append(d.get("token_ids") or tok(d["text"]).input_ids)
    for name, path in (("tiny", TINY), ("1b", one_b_shape())):
        for dtype in ("float32", "bfloat16", "float16"):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).cuda().eval()

            def run(b: int) -> list[list[int]]:
                return [s for i in range(0, len(prompts), b) for s in greedy(model, prompts[i : i + b])]

            first, again = run(1), run(1)
            moved = [f"b{b}: {sum(x != y for x, y in zip(first, run(b)))}/{len(prompts)}" for b in (8, 32)]
            print(name, dtype, "rerun:", sum(x != y for x, y in zip(first, again)), *moved, flush=True)


if __name__ == "__main__":
    main()
