"""The figures of benchmarks/README.md's CTranslate2 section, from finished gate reports.

    python benchmarks/ctranslate2_figures.py reports/ctranslate2-float32-*/ reports/ctranslate2-int8-*/ ...

Per report: verdict, prompts exact / near-tie / divergent (from report.json), and what the
report does not give: the largest |logprob difference| of the chosen token at the positions
where both arms chose the same token (before each prompt's first divergence), read from both
arms' run directories. That is how far the engine's numbers sit from vLLM's where the tokens
agree: float32 kernels differ in the last bits, quantised weights by much more.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from strict_gate.runs.reader import load_run


def chosen_lp(step, token: int) -> float:
    return next(lp for t, lp in step if t == token)


def max_matched_delta(report_dir: Path) -> tuple[float, int]:
    """Largest |lp_candidate - lp_reference| of the shared token over matched prefix positions."""
    ref = load_run(report_dir / "reference").records
    worst, n = 0.0, 0
    for c in load_run(report_dir / "candidate").records.values():
        r = ref[c.id]
        for i, (a, b) in enumerate(zip(r.token_ids, c.token_ids)):
            if a != b:
                break
            worst = max(worst, abs(chosen_lp(c.top_logprobs[i], b) - chosen_lp(r.top_logprobs[i], a)))
            n += 1
    return worst, n


def main(argv: list[str]) -> int:
    print("| gate | verdict | prompts exact | near-tie | divergent | max abs delta chosen logprob (matched positions) |")
    print("|---|---|---|---|---|---|")
    for d in map(Path, argv):
        rep = json.loads((d / "report.json").read_text())
        c, s = rep["summary"]["counts"], rep["summary"]
        worst, n = max_matched_delta(d)
        print(f"| {rep['name']} | {rep['verdict']} | {s['prompts_exact']}/{s['prompts_total']} | {c['near_tie']} "
              f"| {c['divergent']} | {worst:.3g} nats over {n} positions |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
