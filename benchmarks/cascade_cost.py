"""What judging every token after a flip costs a finished gate (benchmarks/README.md, issue 24).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/cascade_cost.py reports/demo-hf-bf16-vs-vllm-fp32-<stamp>

The reference's side is the diagnosis' own re-scoring (the candidate's whole continuation,
already scored before the every-token rule), so the added work is on the candidate's side: it
now scores its own continuation once per diverged prompt (score_candidate), where it scored
the reference's tokens up to the divergence before. This starts the gate's candidate engine
once and times, per diverged prompt and `--repeat` times alternately, both passes, then the
pure-Python judgement (cross_check) over the gate's stored diagnoses. It prints the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from strict_gate.gate.config import load_gate_config
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.diagnose import DIAGNOSED, Diagnosis, _own_gap, cross_check
from strict_gate.judge.stored import load_report
from strict_gate.runs.reader import load_run


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report_dir", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    report = load_report(a.report_dir / "report.json")
    cfg = load_gate_config(a.report_dir / "gate.toml", base_dir=Path(report.config.base_dir))  # type: ignore[union-attr]
    ref, cand = load_run(a.report_dir / "reference"), load_run(a.report_dir / "candidate")
    k = ref.manifest.sampling.top_logprobs
    comparison = compare_runs(ref.records, cand.records, band=cfg.band)
    todo = [p for p in comparison.prompts if p.status in DIAGNOSED and p.first_divergence is not None]
    assert cfg.candidate is not None
    engine = cfg.candidate.build()
    engine.start()
    old, new = [], []
    try:
        fallback = sum(1 for p in todo if _own_gap(p, engine.score(cand.records[p.id].prompt_token_ids,
                                                                  cand.records[p.id].token_ids, k)) is None)
        for _ in range(a.repeat):
            old.append(sum(_timed(lambda p=p: engine.score(ref.records[p.id].prompt_token_ids,
                                                           ref.records[p.id].token_ids[: p.first_divergence.position + 1],
                                                           k)) for p in todo))
            new.append(sum(_timed(lambda p=p: engine.score(cand.records[p.id].prompt_token_ids,
                                                           cand.records[p.id].token_ids, k)) for p in todo))
    finally:
        engine.close()
    raw = json.loads((a.report_dir / "report.json").read_text())
    diagnoses = {p["id"]: Diagnosis.from_json(p["diagnosis"]) for p in raw["prompts"] if p.get("diagnosis")}
    judge_s = statistics.median(_timed(lambda: cross_check(comparison, diagnoses, {}, cand.records, not_scored="-"))
                                for _ in range(a.repeat))
    print(f"{len(todo)} diverged prompt(s), candidate {engine.kind}, {a.repeat} repeats (medians):")
    print(f"  candidate scores the reference's tokens up to the divergence (before): {statistics.median(old):.3f} s")
    print(f"  candidate scores its own whole continuation (now):                     {statistics.median(new):.3f} s")
    print(f"  prompts whose own pass lacks the gap at the divergence (both passes run): {fallback}")
    print(f"  cross_check with every later position judged (pure Python):           {judge_s * 1000:.1f} ms")


if __name__ == "__main__":
    main()
