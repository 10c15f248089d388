"""Scale benchmark: how long `strict-gate compare` (read, audit, compare, every report) takes
and how much memory it peaks at, on synthetic runs of N prompts x T tokens x top-K.

    python benchmarks/scale.py --prompts 1000 --tokens 512 --top 20      # one point
    python benchmarks/scale.py --table                                   # 1,000 and 2,000 x 512 x 20
    python benchmarks/scale.py --grid                                    # the growth table

It writes two honest runs (greedy, sorted, finite, 10% of prompts diverging from some
position on, the candidate then picking the reference's runner-up) into a scratch
directory, runs `strict-gate compare` in a child process, and prints a markdown row:
wall seconds (median of --repeat), peak RSS of the child, the JSONL size, and the floor:
a child process that merely decodes both files with orjson, line by line (median of the
same --repeat, measured between the compare runs), with compare's time over it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

VOCAB = 151_000


def _manifest(n: int, tokens: int, top: int, kind: str) -> dict:
    return {
        "schema": "strict-gate/run@1",
        "status": "complete",
        "engine": {"kind": kind, "model": "synthetic", "options": {}, "env": {}, "versions": {}, "tokenizer": None},
        "prompt_set": {"name": "synthetic", "sha256": "5" * 64, "count": n, "ids": [f"p{i:06d}" for i in range(n)]},
        "sampling": {"max_tokens": tokens, "top_logprobs": top, "temperature": 0.0},
        "created": "2026-11-30T00:00:00+00:00",
        "finished": "2026-11-30T00:00:01+00:00",
        "records": n,
        "runs": 1,
    }


def write_runs(out: Path, n: int, tokens: int, top: int, diverge: float = 0.1, seed: int = 0) -> tuple[Path, Path]:
    """Reference and candidate run directories; returns their paths."""
    rng = np.random.default_rng(seed)
    ref, cand = out / "reference", out / "candidate"
    for d in (ref, cand):
        d.mkdir(parents=True, exist_ok=True)
    def line(i: int, prompt: list, run_ids: np.ndarray, lps: np.ndarray) -> bytes:
        il, ll = run_ids.tolist(), lps.tolist()
        top_json = [[[a, b] for a, b in zip(ir, lr)] for ir, lr in zip(il, ll)]
        rec = {
            "id": f"p{i:06d}", "prompt_token_ids": prompt, "token_ids": run_ids[:, 0].tolist(),
            "finish_reason": "length", "top_logprobs": top_json, "timing": {"ttft_s": 0.01, "total_s": 1.0},
        }
        return msgspec.json.encode(rec) + b"\n"

    with open(ref / "records.jsonl", "wb") as fr, open(cand / "records.jsonl", "wb") as fc:
        for i in range(n):
            base = rng.integers(0, VOCAB - 7 * top, size=tokens)
            ids = base[:, None] + 7 * np.arange(top)[None, :]
            lps = -np.cumsum(rng.exponential(1.0, size=(tokens, top)), axis=1) + 1e-9
            lps[:, 0] = np.minimum(lps[:, 0], 0.0)
            prompt = rng.integers(0, VOCAB, size=64).tolist()
            ref_line = line(i, prompt, ids, lps)
            fr.write(ref_line)
            if rng.random() < diverge:  # from position d on, the candidate prefers the runner-up
                d = int(rng.integers(0, tokens))
                cids = ids.copy()
                cids[d:, [0, 1]] = cids[d:, [1, 0]]
                fc.write(line(i, prompt, cids, lps))
            else:
                fc.write(ref_line)
    for d, kind in ((ref, "synthetic-reference"), (cand, "synthetic-candidate")):
        (d / "manifest.json").write_text(json.dumps(_manifest(n, tokens, top, kind)))
    return ref, cand


FLOOR = (
    "import sys, orjson\n"
    "for p in sys.argv[1:]:\n"
    "    with open(p, 'rb') as f:\n"
    "        for line in f:\n"
    "            orjson.loads(line)\n"
)


def _child_cpu() -> float:
    """User + system CPU seconds of every child waited for so far (load slows a child's wall
    time, not the CPU time its own work takes)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def floor(ref: Path, cand: Path) -> tuple[float, float]:
    """Wall and CPU seconds of a child process that only decodes both records files with orjson."""
    t0, c0 = time.perf_counter(), _child_cpu()
    subprocess.run([sys.executable, "-c", FLOOR, str(ref / "records.jsonl"), str(cand / "records.jsonl")], check=True)
    return time.perf_counter() - t0, _child_cpu() - c0


def measure(ref: Path, cand: Path, reports: Path, repeat: int) -> tuple[float, float, int, float, float, float]:
    """Median wall seconds, median CPU seconds and peak RSS (MB) of `strict-gate compare` in a
    child process, and the orjson floor's median wall and CPU seconds, each floor run right after
    a compare run (same machine load)."""
    times, cpus, floors, floor_cpus, peak = [], [], [], [], 0.0
    for _ in range(repeat):
        shutil.rmtree(reports, ignore_errors=True)
        code = (
            "import resource, sys, time\n"
            "from strict_gate.cli import app\n"
            "t = time.perf_counter()\n"
            f"try:\n    app([ 'compare', {str(ref)!r}, {str(cand)!r}, '--out', {str(reports)!r}], standalone_mode=False)\n"
            "except SystemExit:\n    pass\n"
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)\n"
        )
        t0, c0 = time.perf_counter(), _child_cpu()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _child_cpu() - c0
        inner, rss = (float(x) for x in p.stderr.strip().splitlines()[-1].split())
        if not (reports / "report.json").exists():
            raise SystemExit(f"compare wrote no report.json (exit {p.returncode}): {p.stderr[-2000:]}")
        times.append(wall)
        cpus.append(cpu)
        peak = max(peak, rss)
        f_wall, f_cpu = floor(ref, cand)
        floors.append(f_wall)
        floor_cpus.append(f_cpu)
    size = (ref / "records.jsonl").stat().st_size + (cand / "records.jsonl").stat().st_size
    med = statistics.median
    return med(times), peak, size, med(floors), med(cpus), med(floor_cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--table", action="store_true", help="issue 21's table: 1,000 and 2,000 x 512 x 20")
    ap.add_argument("--grid", action="store_true", help="the growth table: prompts and tokens varied")
    ap.add_argument("--keep", type=Path, help="write the runs here and keep them; runs already there are reused")
    args = ap.parse_args()
    points = [(args.prompts, args.tokens, args.top)]
    if args.grid:
        points = [(n, 512, 20) for n in (250, 500, 1000, 2000)] + [(1000, t, 20) for t in (128, 256)]
    if args.table:
        points = [(n, 512, 20) for n in (1000, 2000)]
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load average {os.getloadavg()}")
    print("| prompts | tokens | top-k | JSONL MB (both runs) | compare + reports s (median) | peak RSS MB "
          "| orjson decode s (median) | compare / orjson | compare CPU s | orjson CPU s | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, t, k in points:
        scratch = args.keep or Path(tempfile.mkdtemp(prefix="sg-scale-"))
        try:
            here = scratch / f"{n}x{t}x{k}"
            if all((here / arm / "manifest.json").exists() for arm in ("reference", "candidate")):
                ref, cand = here / "reference", here / "candidate"  # written before (--keep): reused
            else:
                ref, cand = write_runs(here, n, t, k)
            wall, rss, size, base, cpu, base_cpu = measure(ref, cand, scratch / f"{n}x{t}x{k}" / "reports", args.repeat)
            print(f"| {n} | {t} | {k} | {size / 1e6:.0f} | {wall:.2f} | {rss:.0f} | {base:.2f} | {wall / base:.2f}x "
                  f"| {cpu:.2f} | {base_cpu:.2f} | {cpu / base_cpu:.2f}x |", flush=True)
            print(f"load average after: {os.getloadavg()}", flush=True)
        finally:
            if args.keep is None:
                shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
