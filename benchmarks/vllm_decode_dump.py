#!/usr/bin/env python
"""vLLM's decode-path dump against its prefill dump (docs/localize.md, "vLLM's decode path").

    python benchmarks/vllm_decode_dump.py [--model bundled:tiny-llama] [--chunk 0] [--prompts 4]

Each prompt's ids (41 of them) are dumped twice by the vllm engine, float32, eager, on the test
options of tests/conftest.py: one prefill pass, and the decode path (the first 20 + 3i ids as the
prompt, the rest forced one per step). Prints the largest rel_diff per point between the two and
the seconds each kind of dump took (the first prompt's dumps, which pay the engine's starts, left
out). --chunk N: chunked prefill with N tokens per step.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bundled:tiny-llama")
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args()
    from strict_gate.engines.base import DumpRequest
    from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions
    from strict_gate.localize.capture import capture
    from strict_gate.localize.compare import compare_points

    engine = VLLMEngine(VLLMOptions(model=args.model, dtype="float32", enforce_eager=True,
                                    kv_cache_memory_bytes=64 * 1024 * 1024, max_model_len=512, seed=0), base_dir=ROOT)
    if args.chunk:
        engine = engine.with_prefill_chunk(args.chunk)
    worst: dict[str, float] = {}
    seconds = {"prefill": 0.0, "decode": 0.0}
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.prompts):
            ids = tuple([1] + [(29 * j + 7 + 13 * i) % 1000 + 4 for j in range(40)])
            n0 = 20 + 3 * i
            positions = tuple(range(n0 - 4, len(ids)))
            got = {}
            for mode, decode_from in (("prefill", None), ("decode", n0)):
                t0 = time.perf_counter()
                request = DumpRequest(ids, None, positions, Path(work) / f"{i}-{mode}", decode_from=decode_from)
                got[mode] = capture(engine, request).tensors
                if i:
                    seconds[mode] += time.perf_counter() - t0
            for p in compare_points(got["prefill"], got["decode"], 1e-10):
                worst[p.name] = max(worst.get(p.name, 0.0), p.rel_diff or 0.0)
    engine.close()
    print(f"model {args.model}, chunk {args.chunk or 'off'}: largest rel_diff, decode vs prefill dump, "
          f"{args.prompts} prompts")
    for name, d in worst.items():
        print(f"  {name:24s} {d:.3g}")
    print(f"seconds over the last {args.prompts - 1} prompts: "
          + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()))


if __name__ == "__main__":
    main()
