"""What a dump costs the C++ example engine (examples/engines/cpp/dump.hpp) on a real model.

One prompt of the model's committed baseline and its 16 generated tokens, the last 8 positions
kept (what `strict-gate localize` asks), five requests to one engine process: the layer-level
points along the prompt path and along the decode path, one layer's ops (the narrowing pass)
along each, and every op of every layer. Per request: wall time, the engine's own CPU time
(utime + stime from /proc: steadier than wall time on a shared machine), the points and bytes
written; the process's peak RSS (VmHWM) after each.

    python benchmarks/cpp_dump_cost.py [--model DIR] [--baseline DIR] [--binary build/cpp/engine]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = ("attn_norm", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.core", "attn.o_proj", "attn", "mlp_norm",
       "mlp.gate_proj", "mlp.up_proj", "mlp.act", "mlp.down_proj", "mlp", "")


def layer_ops(layer: int) -> list[str]:
    return [f"layers.{layer}.{o}" if o else f"layers.{layer}" for o in OPS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache/strict-gate/models/smollm2-135m"))
    ap.add_argument("--baseline", default=str(ROOT / "baselines/smollm2-135m-vllm-fp32"))
    ap.add_argument("--binary", default=str(ROOT / "build/cpp/engine"))
    args = ap.parse_args()
    first = json.loads(Path(args.baseline, "records.jsonl").read_text(encoding="utf-8").splitlines()[0])
    ids, n0 = first["prompt_token_ids"] + first["token_ids"], len(first["prompt_token_ids"])
    layers = json.loads(Path(args.model, "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    proc = subprocess.Popen([args.binary, "--model", args.model], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    json.loads(proc.stdout.readline())

    def cpu() -> float:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_mib() -> float:
        line = next(x for x in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if x.startswith("VmHWM"))
        return int(line.split()[1]) / 1024

    decode = {"mode": "decode", "decode_from": n0}
    every = ["embed", *(p for i in range(layers) for p in layer_ops(i)), "norm", "logits"]
    asks = [("layers, prefill", {}), ("layers, decode", decode),
            (f"layer {layers - 1}'s ops, prefill", {"points": layer_ops(layers - 1)}),
            (f"layer {layers - 1}'s ops, decode", {"points": layer_ops(layers - 1), **decode}),
            ("every op of every layer, prefill", {"points": every})]
    print(f"{args.model}: {len(ids)} ids ({n0} prompt), 8 positions; peak RSS after load {peak_mib():.0f} MiB")
    for what, extra in asks:
        with tempfile.TemporaryDirectory() as d:
            t0, c0 = time.perf_counter(), cpu()
            proc.stdin.write(json.dumps({"op": "dump", "id": what, "prompt_token_ids": ids, "directory": d,
                                         "positions": list(range(len(ids) - 8, len(ids))), **extra}) + "\n")
            proc.stdin.flush()
            reply = json.loads(proc.stdout.readline())
            wall, used = time.perf_counter() - t0, cpu() - c0
            if "error" in reply:
                raise SystemExit(f"{what}: {reply['error']}")
            size = os.path.getsize(reply["path"])
        print(f"| {what} | {wall:.2f} s | {used:.2f} s | {len(reply['points'])} | {size / 1e6:.2f} MB | "
              f"{peak_mib():.0f} MiB |")
    proc.stdin.close()
    proc.wait()


if __name__ == "__main__":
    main()
