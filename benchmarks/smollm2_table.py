"""The real model's gate table (benchmarks/README.md, "The real model") from report directories.

    python benchmarks/smollm2_table.py reports/smollm2-*/ [--json out.json]

One row per report.json: verdict, prompts exact, positions matched, near-ties, divergent, other
non-matching statuses, the largest reference gap among near-ties, how many near-ties were
re-scored with a negative candidate gap (the candidate's prefill prefers the reference's token),
and the candidate arm's wall clock (a recorded reference's is its capture's).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def row(report_dir: Path) -> dict:
    d = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    s = d["summary"]
    counts = s["counts"]
    gaps, negative = [], 0
    for p in d["prompts"]:
        fd = p.get("first_divergence") or {}
        if p.get("status") == "near_tie" and fd.get("reference_gap") is not None:
            gaps.append(fd["reference_gap"])
        cand = (fd.get("candidate_rescored") or {}).get("gap")
        if cand is not None and cand < 0:
            negative += 1
    other = {k: v for k, v in counts.items() if k not in ("match", "near_tie", "divergent") and v}
    wall = {arm: w.get("seconds") for arm, w in (d.get("wall_clock") or {}).items() if isinstance(w, dict)}
    return {"gate": d["name"], "dir": report_dir.name, "verdict": d["verdict"], "prompts_exact": s["prompts_exact"],
            "prompts": s["prompts_total"], "positions": f"{s['positions_matched']}/{s['positions_total']}",
            "near_ties": counts.get("near_tie", 0), "divergent": counts.get("divergent", 0), "other": other,
            "max_near_tie_reference_gap": max(gaps) if gaps else None, "negative_candidate_gaps": negative,
            "wall_s": wall, "rescored_by": d.get("rescored_by")}


def markdown(rows: list[dict]) -> str:
    out = ["| gate | verdict | prompts exact | positions | near-ties | divergent | other | largest near-tie gap (nats) "
           "| negative re-scored candidate gaps | candidate arm wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gap = "-" if r["max_near_tie_reference_gap"] is None else f"{r['max_near_tie_reference_gap']:.3f}"
        wall = f"{r['wall_s'].get('candidate') or 0:.0f}"
        other = ", ".join(f"{k} {v}" for k, v in r["other"].items()) or "-"
        out.append(f"| `{r['gate']}` | {r['verdict']} | {r['prompts_exact']}/{r['prompts']} | {r['positions']} "
                   f"| {r['near_ties']} | {r['divergent']} | {other} | {gap} | {r['negative_candidate_gaps']} | {wall} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [row(p) for p in args.reports if (p / "report.json").is_file()]
    print(markdown(rows), end="")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
