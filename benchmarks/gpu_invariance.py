"""Batch invariance of the hf arm on a GPU: the same prompts at batch 1, 8 and 32.

`python benchmarks/gpu_invariance.py MODEL_DIR` runs the gate's own hf engine (left-padded
batched `generate` with the attention mask) over a prompt set at each batch size and dtype, and
compares every batch size's records with batch 1's by the gate's comparator: prompts exact,
positions matched, and each moved prompt's status (a flip inside the band is a batch-variant
near-tie, beyond it a real batch dependence). MODEL_DIR is `benchmarks/gpu.py model`'s 1B-shaped
random Llama. Prints one JSON line per (dtype, batch) and a markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(model: Path, dtype: str, batch: int, device: str, prompts, max_tokens: int, k: int):
    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.gate.arm import prompt_inputs
    from strict_gate.runs.records import Sampling

    engine = HFEngine(HFOptions(model=str(model), dtype=dtype, device=device, batch=batch))
    engine.start()
    inputs = prompt_inputs(prompts, engine)
    list(engine.generate(inputs[:batch], Sampling(max_tokens, k)))  # warm-up at this shape
    t0 = time.perf_counter()
    records = {r.id: r for r in engine.generate(inputs, Sampling(max_tokens, k))}
    wall = time.perf_counter() - t0
    engine.close()
    return records, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompts", type=Path, default=ROOT / "prompts" / "battery-128.jsonl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--top-logprobs", type=int, default=5)
    ap.add_argument("--band", type=float, default=0.5)
    args = ap.parse_args()

    from strict_gate.judge.compare_runs import compare_runs
    from strict_gate.runs.prompts import load_prompts

    prompts = load_prompts(args.prompts)
    rows = []
    for dtype in args.dtypes:
        base, base_wall = run(args.model, dtype, 1, args.device, prompts, args.max_tokens, args.top_logprobs)
        errors = [r.id for r in base.values() if r.error]
        for batch in args.batches:
            recs, wall = (base, base_wall) if batch == 1 else run(
                args.model, dtype, batch, args.device, prompts, args.max_tokens, args.top_logprobs)
            s = compare_runs(base, recs, band=args.band, prompt_ids=prompts.ids).summary
            row = {"dtype": dtype, "batch": batch, "prompts": len(prompts), "prompts_exact": s.prompts_exact,
                   "positions_matched": s.positions_matched, "positions_total": s.positions_total,
                   "counts": {str(k): v for k, v in s.counts.items()}, "wall_s": round(wall, 2),
                   "cost_vs_batch1": round(wall / base_wall, 3), "errors_at_batch1": errors}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| dtype | batch | prompts exact vs batch 1 | positions | moved: statuses | wall s (x batch 1) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        moved = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items()) if k != "match" and v) or "none"
        print(f"| {r['dtype']} | {r['batch']} | {r['prompts_exact']}/{r['prompts']} "
              f"| {r['positions_matched']}/{r['positions_total']} | {moved} | {r['wall_s']} ({r['cost_vs_batch1']}x) |")


if __name__ == "__main__":
    main()
