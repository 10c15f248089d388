#!/usr/bin/env python
"""Does a battery built to be sensitive catch more with fewer prompts? (issue 20, docs/battery.md)

    python benchmarks/sensitivity.py [--pool-sample 0] [--seeds 10] [--models bundled:tiny-llama DIR...]

Ground truth by construction: each perturbed model is the reference plus seeded Gaussian noise
on every weight (w + s * rms(w) * N(0, 1) per tensor, relative scales s = 1e-4 .. 3e-3,
float32), or the same weights in bfloat16. Every prompt of the pool (or a seeded sample of it)
and of battery-128 is generated once per model, in process, with the hf engine's batched
generation (generate_batch, left-padded batches in a fixed order of prompt length) - not through
whole gates, which would cost a model load and a run directory per seed. The unperturbed
model is run the same way (same batches), so a prompt "flips" when its tokens differ from it:
exactly what a strict gate over that prompt would fail on. The unperturbed model run a second
time is the control (it must flip nothing).

Batteries, all scored on the same generations: random N-prompt subsets of the pool and of
battery-128 (N = 16, 32, 64, 128; 20 seeded draws each), battery-128 itself, and the
sensitive battery of each N chosen by strict_gate.battery from the unperturbed run's margins
only (the rule of `strict-gate battery build`: sigma calibrated on the pool, default coverage).
Figures per battery and perturbation: detection (share of seeds where at least one prompt
flips), prompts flipped (mean), and drift: the battery's largest |delta logprob| of the chosen
token at matched positions (judge/prefix_drift.py), with "seen" = a flip or drift above
FLOAT32_ROUNDING_MAX (1e-3 nats).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strict_gate.battery.margins import calibrate, profile, prompt_flip_probabilities
from strict_gate.battery.select import Candidate, default_coverage, select
from strict_gate.engines.base import PromptInput
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.judge.prefix_drift import FLOAT32_ROUNDING_MAX, prefix_drift
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.records import Record, Sampling

SCALES = (1e-4, 3e-4, 1e-3, 3e-3)
SIZES = (16, 32, 64, 128)
DRAWS = 20


def generate_all(engine: HFEngine, inputs: list[PromptInput], sampling: Sampling, batch: int) -> dict[str, Record]:
    order = sorted(inputs, key=lambda p: (len(p.token_ids), p.id))
    out: dict[str, Record] = {}
    for i in range(0, len(order), batch):
        for rec in engine.generate_batch(order[i:i + batch], sampling):
            if rec.error:
                raise SystemExit(f"{rec.id}: {rec.error}")
            out[rec.id] = rec
    return out


def perturb(model, base: dict, scale: float, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = base[name]
            rms = w.pow(2).mean().sqrt()
            p.copy_(w + scale * rms * torch.randn(w.shape, generator=gen, dtype=w.dtype).to(w.device))


def restore(model, base: dict) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(base[name])


def compare(ref: dict[str, Record], cand: dict[str, Record]) -> dict[str, tuple[bool, float]]:
    """id -> (flipped, max |delta logprob| at matched positions)."""
    out = {}
    for pid, r in ref.items():
        c = cand[pid]
        n = min(len(r.token_ids), len(c.token_ids))
        d = next((i for i in range(n) if r.token_ids[i] != c.token_ids[i]), n)
        flipped = r.token_ids != c.token_ids
        pd = prefix_drift(r, c, d)
        out[pid] = (flipped, pd.max_abs_dlogprob if pd else 0.0)
    return out


def batteries(pool_ids, b128_ids, ref, groups, rng) -> tuple[dict[str, list[list[str]]], float]:
    profiles = [profile(ref[i]) for i in pool_ids]
    sigma = calibrate(profiles)
    p = prompt_flip_probabilities(profiles, sigma)
    cands = [Candidate(pr.id, groups[pr.id], float(q), pr.smallest) for pr, q in zip(profiles, p)]
    ngroups = len(set(groups[i] for i in pool_ids))
    out: dict[str, list[list[str]]] = {"battery-128": [list(b128_ids)]}
    for n in SIZES:
        out[f"sensitive-{n}"] = [[c.id for c in select(cands, n, default_coverage(n, ngroups), 0)]]
        out[f"random-pool-{n}"] = [list(rng.choice(pool_ids, n, replace=False)) for _ in range(DRAWS)]
        if n < len(b128_ids):
            out[f"random-b128-{n}"] = [list(rng.choice(b128_ids, n, replace=False)) for _ in range(DRAWS)]
    return out, sigma


def score(bats, results) -> dict:
    """battery -> figures over the perturbation's seeds (and draws, for random batteries)."""
    out = {}
    for name, draws in bats.items():
        det, seen, flipped, drift = [], [], [], []
        for res in results:
            for ids in draws:
                f = sum(res[i][0] for i in ids)
                dmax = max(res[i][1] for i in ids)
                det.append(f > 0)
                seen.append(f > 0 or dmax > FLOAT32_ROUNDING_MAX)
                flipped.append(f)
                drift.append(dmax)
        out[name] = {"detection": float(np.mean(det)), "seen": float(np.mean(seen)),
                     "flipped": float(np.mean(flipped)), "drift": float(np.median(drift))}
    return out


def run_model(model_ref: str, args, pool, b128) -> dict:
    engine = HFEngine(HFOptions(model=model_ref, dtype="float32", device=args.device, threads=args.threads))
    every = list(pool) + list(b128)
    inputs = [PromptInput(p.id, tuple(engine.tokenize(p.text)), p.text) for p in every]
    sampling = Sampling(args.max_tokens, args.top_logprobs)
    engine.start()
    model = engine._model  # the benchmark perturbs the loaded weights in place
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    t0 = time.perf_counter()
    ref = generate_all(engine, inputs, sampling, args.batch)
    per_run = time.perf_counter() - t0
    groups = {p.id: (p.tags[0] if p.tags else "") for p in every}
    rng = np.random.default_rng(0)
    bats, sigma = batteries([p.id for p in pool], [p.id for p in b128], ref, groups, rng)
    perts: dict[str, list] = {"control (none)": [compare(ref, generate_all(engine, inputs, sampling, args.batch))]}
    for s in SCALES:
        perts[f"noise {s:g}"] = []
        for seed in range(args.seeds):
            perturb(model, base, s, 1000 * seed + 7)
            perts[f"noise {s:g}"].append(compare(ref, generate_all(engine, inputs, sampling, args.batch)))
        restore(model, base)
        print(f"  {model_ref}: noise {s:g} done", flush=True)
    engine.close()
    bf = HFEngine(HFOptions(model=model_ref, dtype="bfloat16", device=args.device, threads=args.threads))
    perts["bf16 vs fp32"] = [compare(ref, generate_all(bf, inputs, sampling, args.batch))]
    bf.close()
    return {"model": model_ref, "sigma": sigma, "seconds_per_generation": per_run,
            "prompts": {"pool": len(pool), "battery-128": len(b128)},
            "figures": {k: score(bats, v) for k, v in perts.items()}}


def markdown(results: list[dict], args) -> str:
    lines = []
    for r in results:
        perts = list(r["figures"])
        lines.append(f"### {r['model']} (pool {r['prompts']['pool']} prompts, sigma {r['sigma']:g} nats)\n")
        for fig, what in (("detection", "detection rate (share of seeds with a flip)"),
                          ("flipped", "prompts flipped (mean)"),
                          ("seen", "flip or drift > 1e-3 nats (share)"),
                          ("drift", "largest |delta logprob| at matched positions (median)")):
            lines.append(f"{what}:\n")
            lines.append("| battery | " + " | ".join(perts) + " |")
            lines.append("|---|" + "---|" * len(perts))
            for b in r["figures"][perts[0]]:
                cells = [r["figures"][p][b][fig] for p in perts]
                fmt = (lambda x: f"{x:.2g}") if fig == "drift" else (
                    (lambda x: f"{x:.1f}") if fig == "flipped" else (lambda x: f"{100 * x:.0f}%"))
                lines.append(f"| {b} | " + " | ".join(fmt(c) for c in cells) + " |")
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["bundled:tiny-llama"])
    ap.add_argument("--pool", default=str(ROOT / "prompts" / "pool-2k.jsonl"))
    ap.add_argument("--pool-sample", type=int, default=0, help="a seeded sample of the pool (0: all of it)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--top-logprobs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sensitivity"))
    args = ap.parse_args(argv)
    pool = list(load_prompts(args.pool).prompts)
    if args.pool_sample:
        keep = set(np.random.default_rng(1).choice(len(pool), args.pool_sample, replace=False).tolist())
        pool = [p for i, p in enumerate(pool) if i in keep]
    b128 = list(load_prompts(ROOT / "prompts" / "battery-128.jsonl").prompts)
    t0 = time.time()
    results = [run_model(m, args, pool, b128) for m in args.models]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(["python", "benchmarks/sensitivity.py", *(argv or sys.argv[1:])]),
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, threads {args.threads}",
            "wall_s": round(time.time() - t0, 1), "seeds": args.seeds, "draws": DRAWS}
    (out / "sensitivity.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (out / "sensitivity.md").write_text(f"command: `{meta['command']}` ({meta['wall_s']} s)\n\n" + markdown(results, args))
    print((out / "sensitivity.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
