"""Run the shipped llama.cpp gates and print the table of benchmarks/README.md ("llama.cpp").

    bash scripts/install-llamacpp.sh && .venv/bin/python benchmarks/llamacpp.py [-o DIR]

Per gate: verdict, exit code, prompts exact, near-ties, divergent, positions matched, the
largest |logprob difference| of the chosen token where both engines chose the same token (the
matched prefix of every prompt: how far llama.cpp's numbers sit from vLLM's while the tokens
still agree) and the wall time of the whole `strict-gate gate` command (engine start-up and
vLLM re-scoring included). The figures depend on the CPU, so they are recorded, not asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strict_gate.runs.reader import load_run

GATES = ("llamacpp-f32", "llamacpp-f32-kv-f16", "llamacpp-f16", "llamacpp-q8_0")


def max_chosen_delta(report_dir: Path) -> float:
    """max |lp_cand(t) - lp_ref(t)| over the positions before each prompt's first divergence."""
    ref, cand = load_run(report_dir / "reference"), load_run(report_dir / "candidate")
    worst = 0.0
    for pid, r in ref.records.items():
        c = cand.records[pid]
        for i, (a, b) in enumerate(zip(r.token_ids, c.token_ids)):
            if a != b:
                break
            la, lb = r.logprob_at(i, a), c.logprob_at(i, b)
            if la is not None and lb is not None:
                worst = max(worst, abs(la - lb))
    return worst


def run(gate: str, out: Path) -> dict:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", str(gate if gate.endswith(".toml") else ROOT / "gates" / f"{gate}.toml"),
                        "-o", str(out / Path(gate).stem)], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    reports = list((out / Path(gate).stem).glob("*/report.json"))
    if not reports:
        raise SystemExit(f"{gate}: no report (exit {p.returncode}):\n{p.stderr[-3000:]}")
    rep = json.loads(reports[0].read_text())
    s = rep["summary"]
    return {
        "gate": Path(gate).stem, "exit": p.returncode, "verdict": rep["verdict"], "exact": s["prompts_exact"],
        "total": s["prompts_total"], "near_tie": s["counts"].get("near_tie", 0),
        "divergent": s["counts"].get("divergent", 0), "other": {k: v for k, v in s["counts"].items()
                                                                 if v and k not in ("match", "near_tie", "divergent")},
        "positions": f'{s["positions_matched"]}/{s["positions_total"]}',
        "max_dlp": max_chosen_delta(reports[0].parent), "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=None, help="where the reports go (default: a temp dir)")
    ap.add_argument("gates", nargs="*", default=list(GATES), help="gate names or TOML paths")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="llamacpp-bench-"))
    print("| gate | verdict (exit) | prompts exact | near-tie | divergent | other | positions | "
          "max |Δ logprob| chosen | wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for gate in args.gates:
        r = run(gate, out)
        print(f'| `{r["gate"]}` | {r["verdict"]} ({r["exit"]}) | {r["exact"]}/{r["total"]} | {r["near_tie"]} | '
              f'{r["divergent"]} | {r["other"] or "–"} | {r["positions"]} | {r["max_dlp"]:.2e} | {r["wall_s"]:.0f} s |',
              flush=True)
    print(f"reports under {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
