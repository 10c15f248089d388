"""GPU figures for the hf arm: a Llama-3.2-1B-shaped model with random weights, and a ladder.

`model DIR` builds LlamaConfig(hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate
8192, vocab 128256) with seeded random bf16 weights and saves it with the bundled tiny-llama
tokenizer. That tokenizer has 1,024 ids, all inside the model's 128,256, so the model keeps
the real 1B shape (the lm_head and a 128,256-wide log_softmax per step cost what they cost in
Llama-3.2-1B) while every prompt id is one the tokenizer knows; generated ids above 1,023 are
never decoded, only compared. `--tiny` builds a 2-layer 64-wide model instead, to try the
whole script on a CPU first.

`ladder DIR [--dtype float32]` measures the gate's hf engine from outside, at prompt lengths 128/1024/4096
(random ids, seeded) with 128 generated tokens: TTFT is the wall time of a max_tokens=1 call,
decode tok/s is (n - 1) / (t_full - ttft) of the full call that follows; 1 warm-up, then the
median and min-max of `--runs` runs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import time
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent.parent / "strict_gate" / "models" / "tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_model(out: Path, tiny: bool) -> None:
    """Save a random-weight Llama of the 1B shape (or a tiny one) with the bundled tokenizer."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    shape = (
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1024)
        if tiny else
        dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
             intermediate_size=8192, vocab_size=128256)
    )
    config = LlamaConfig(**shape, max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3, dtype="bfloat16")
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(BUNDLED / name, out / name)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {n / 1e9:.3f} B parameters ({shape}) to {out}", flush=True)


def ladder(model: Path, device: str, lengths: list[int], new_tokens: int, runs: int,
           dtype: str = "bfloat16") -> list[dict]:
    """TTFT and decode tok/s of the gate's hf engine per prompt length, measured from outside."""
    from strict_gate.engines.base import PromptInput
    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.runs.records import Sampling

    engine = HFEngine(HFOptions(model=str(model), dtype=dtype, device=device))
    engine.start()
    rng = random.Random(0)
    rows = []
    for length in lengths:
        prompt = PromptInput(id=f"len-{length}", token_ids=tuple(rng.randrange(4, 1024) for _ in range(length)))

        def call(max_tokens: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            (rec,) = list(engine.generate([prompt], Sampling(max_tokens, 5)))
            if rec.error:
                raise SystemExit(f"length {length}: {rec.error}")
            return time.perf_counter() - t0, len(rec.token_ids)

        ttfts, decodes, made = [], [], []
        for i in range(runs + 1):
            ttft, _ = call(1)
            full, n = call(new_tokens)
            if i == 0:
                continue  # warm-up
            ttfts.append(ttft)
            decodes.append((n - 1) / (full - ttft))
            made.append(n)
        row = {
            "dtype": dtype, "prompt_tokens": length, "new_tokens": new_tokens, "generated": made, "runs": runs,
            "ttft_s": ttfts, "decode_tok_s": decodes,
            "ttft_median_s": statistics.median(ttfts), "decode_median_tok_s": statistics.median(decodes),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    engine.close()
    return rows


def ladder_markdown(rows: list[dict]) -> str:
    out = ["| prompt tokens | generated | TTFT median ms (min-max) | decode tok/s median (min-max) |",
           "|---|---|---|---|"]
    for r in rows:
        t, d = r["ttft_s"], r["decode_tok_s"]
        out.append(
            f"| {r['prompt_tokens']} | {min(r['generated'])}-{max(r['generated'])} "
            f"| {1000 * r['ttft_median_s']:.1f} ({1000 * min(t):.1f}-{1000 * max(t):.1f}) "
            f"| {r['decode_median_tok_s']:.1f} ({min(d):.1f}-{max(d):.1f}) |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="build and save the model")
    m.add_argument("dir", type=Path)
    m.add_argument("--tiny", action="store_true")
    lad = sub.add_parser("ladder", help="TTFT and decode tok/s per prompt length")
    lad.add_argument("dir", type=Path)
    lad.add_argument("--device", default="cuda")
    lad.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    lad.add_argument("--lengths", nargs="+", type=int, default=[128, 1024, 4096])
    lad.add_argument("--new-tokens", type=int, default=128)
    lad.add_argument("--runs", type=int, default=5)
    lad.add_argument("--json", type=Path)
    lad.add_argument("--md", type=Path)
    args = ap.parse_args()
    if args.cmd == "model":
        build_model(args.dir, args.tiny)
        return
    rows = ladder(args.dir, args.device, args.lengths, args.new_tokens, args.runs, args.dtype)
    table = ladder_markdown(rows)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.md:
        args.md.write_text(table)


if __name__ == "__main__":
    main()
