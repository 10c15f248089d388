"""What moved where, from a kimi-state-boundaries report directory, judged by the gate's own functions.

The device budget of issue 52's run ended before the gate wrote its report (every run but the
reference's `prefix-off-65` sealed; README.md beside, "State boundaries on the GPU"). This reads the
sealed runs and judges them exactly as the gate does: each variant against its arm's batch-1 run
(`judge_variant`), the candidate's beside the reference's own moves (`paired`), the two arms'
batch-1 tokens against each other (`compared`), and, with --golden, the golden's votes at the gate's
first divergences and at every variant move (`vote_all`, `vote_moves`) and the reference checked
against it (`check_reference`), through an hf engine on this machine.

    python benchmarks/gpu_vllm/state_table.py REPORT_DIR GATE.toml [--golden MODEL_DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.gate.config import load_gate_config
from strict_gate.golden.result import GoldenResult
from strict_gate.golden.run import check_reference, diverged, started, vote_all
from strict_gate.golden.variants import Move, vote_moves
from strict_gate.invariance.config import InvariancePolicy, VariantKind
from strict_gate.invariance.continuation import compared
from strict_gate.invariance.moves import paired
from strict_gate.invariance.run import served_no_cache
from strict_gate.invariance.verdict import CAUSES, InvarianceResult, Pairing, judge_variant, not_run
from strict_gate.runs.reader import load_run

ARMS = ("candidate", "reference")


def judged(report: Path, cfg_path: Path, band: float) -> InvarianceResult:
    variants = load_gate_config(cfg_path).features["invariance"].variants
    out = []
    for arm in ARMS:
        base = load_run(report / "invariance" / arm / "baseline")
        for v in variants:
            d = report / "invariance" / arm / v.name
            if not (d / "records.seal").exists():
                why = "no records: not served by this arm" if not (d / "manifest.json").exists() and arm == "candidate" \
                    else "not finished: the device budget ended inside this run"
                out.append(not_run(v.name, arm, why))
                continue
            run = load_run(d)
            problems = [p] if v.kind == VariantKind.PREFIX_CACHE and (p := served_no_cache(arm, v, run)) else []
            out.append(judge_variant(v.name, arm, base, [run], policy=InvariancePolicy.INFORMATIONAL, band=band,
                                     problems=problems, cause=CAUSES.get(v.kind, "batch"), exact=v.exact))
    return paired(InvarianceResult(InvariancePolicy.INFORMATIONAL, band, {}, tuple(out), {}))


def table(inv: InvarianceResult) -> list[str]:
    by = {(v.arm, v.name): v for v in inv.variants}
    rows = ["| variant | reference (vLLM) moved | candidate (KDA engine) moved | moves with the reference | "
            "candidate alone | reference alone | both differently |", "|---|---|---|---|---|---|---|"]
    for (arm, name), c in by.items():
        if arm != "candidate":
            continue
        r = by[("reference", name)]

        def moved(v):
            if not v.runs:
                return f"not run ({v.problems[0]})"
            return f"{len(v.divergences)}/{v.prompts_total}" + (f" ({v.verdict}: {v.problems[0]})" if v.problems else "")
        pairs = Counter(k for _, k in (c.pairs or ()))
        rows.append(f"| {name} | {moved(r)} | {moved(c)} | {pairs[Pairing.WITH_REFERENCE]} | "
                    f"{pairs[Pairing.CANDIDATE_ONLY]} | {pairs[Pairing.REFERENCE_ONLY]} | {pairs[Pairing.DIFFERENTLY]} |")
    return rows


def golden(model: str, report: Path, inv: InvarianceResult, band: float) -> GoldenResult:
    ref, cand = load_run(report / "reference"), load_run(report / "candidate")
    gate = compared(ref, cand, band).comparison
    print("gate (candidate vs reference, batch 1):", dict(Counter(str(p.status) for p in gate.prompts)))
    moves = tuple(Move(v.arm, v.name, m.id, m.position, m.baseline_tokens[: m.position], m.baseline_token,
                       m.variant_token) for v in inv.variants for m in v.divergences
                  if m.position is not None and m.baseline_token is not None and m.variant_token is not None
                  and m.baseline_token != m.variant_token)
    engine = HFEngine(HFOptions(model=model, dtype="float64", device="cpu"))
    try:
        why = started(engine)
        votes = vote_all(engine, diverged(gate.prompts), ref.records, why)
        health = check_reference(engine, ref.records, list(ref.records), band, why)
        variants = vote_moves(engine, moves, ref.records, len(moves), why, band)
        info = engine.info() if why is None else None
    finally:
        engine.close()
    return GoldenResult(info, False, band, (), votes, health, () if why is None else (why,), variants)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report", type=Path)
    ap.add_argument("config", type=Path, help="the gate's config (its [invariance] names the variants)")
    ap.add_argument("--band", type=float, default=0.5)
    ap.add_argument("--golden", help="the model directory the float64 golden loads (on this machine's CPU)")
    ap.add_argument("--json", type=Path, help="write the judged variants (and the golden's section) here")
    a = ap.parse_args()
    inv = judged(a.report, a.config, a.band)
    print("\n".join(table(inv)))
    body = {"invariance": inv.to_json()}
    if a.golden:
        g = golden(a.golden, a.report, inv, a.band)
        print("golden:", g.headline())
        body["golden"] = g.to_json()
    if a.json:
        a.json.write_text(json.dumps(body, indent=1, allow_nan=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
