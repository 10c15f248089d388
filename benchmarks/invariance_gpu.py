#!/usr/bin/env python
"""The hf arm's [invariance] batch variants on a GPU (benchmarks/README.md, "Invariance").

    python benchmarks/invariance_gpu.py OUT_DIR [--shapes tiny,1b] [--dtypes bfloat16,float32]

For each shape and dtype: a gate whose candidate is transformers on cuda, its variants batch
8 and 32 (one left-padded batched generate with the attention mask) against its own batch-1
run, on prompts/battery-128.jsonl, 16 greedy tokens. `tiny` is the bundled tiny-llama; `1b`
a Llama of Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192) with
RANDOM weights (seed 0, transformers' init, initializer_range 0.02) and the bundled tokenizer's
1024-token vocabulary: what cuBLAS does with the shapes of a real 1B model, not its margins
(random weights make flatter distributions, so more near-ties, than a trained model).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "strict_gate" / "models" / "tiny-llama"


def one_b(out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = out / "llama-1b-shape"
    if (path / "config.json").exists():
        return path
    tiny = LlamaConfig.from_pretrained(TINY)
    cfg = LlamaConfig(vocab_size=tiny.vocab_size, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tiny.bos_token_id,
                      eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(TINY / f, path / f)
    return path


def gate(out: Path, shape: str, model: Path, dtype: str) -> Path:
    text = f'''name = "invariance-gpu-{shape}-{dtype}"
prompts = "{ROOT / "prompts" / "battery-128.jsonl"}"
max_tokens = 16
top_logprobs = 5
[reference]
kind = "hf"
model = "{model}"
[candidate]
kind = "hf"
model = "{model}"
dtype = "{dtype}"
device = "cuda"
[invariance]
batch = [8, 32]
policy = "informational"
'''
    path = out / f"invariance-gpu-{shape}-{dtype}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--shapes", default="tiny,1b")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rc = 0
    for shape in args.shapes.split(","):
        model = TINY if shape == "tiny" else one_b(args.out)
        for dtype in args.dtypes.split(","):
            cfg = gate(args.out, shape, model, dtype)
            p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "invariance", str(cfg), "-o",
                                str(args.out / "reports")], cwd=ROOT)
            rc = rc or p.returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
