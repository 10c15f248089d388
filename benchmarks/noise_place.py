"""A candidate run's flips placed against a reference's noise profile, from stored runs alone.

    python benchmarks/noise_place.py PROFILE REFERENCE_RUN CANDIDATE_RUN [--band 0.5]

What a gate with a [noise] table reports (strict_gate/noise/annotate.py), for runs whose gate
cannot be configured here (a model name this checkout does not resolve, so the profile's fit to
the gate cannot be checked: this script does not check it, and says so). Prints the headline,
the flips by where they sit, and the largest candidate gap.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from strict_gate.judge.compare_runs import compare_runs
from strict_gate.noise.annotate import judge_noise
from strict_gate.noise.profile import load_profile
from strict_gate.runs.reader import load_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile", type=Path)
    ap.add_argument("reference", type=Path)
    ap.add_argument("candidate", type=Path)
    ap.add_argument("--band", type=float, default=0.5)
    a = ap.parse_args()
    profile = load_profile(a.profile)
    ref, cand = load_run(a.reference), load_run(a.candidate)
    if ref.manifest.prompt_set.get("sha256") != profile.provenance.battery.sha256:
        raise SystemExit("the reference run is on another battery than the profile")
    comparison = compare_runs(ref.records, cand.records, band=a.band)
    dtypes = {arm: run.manifest.engine.options.get("dtype") for arm, run in (("reference", ref), ("candidate", cand))}
    j = judge_noise(profile, str(a.profile), comparison, band=a.band, band_rule=None, dtypes=dtypes)
    print("(the profile's fit to these runs' model is not checked here)")
    print(j.headline())
    print("by place:", dict(Counter(f.where.value for f in j.flips)))
    known = [f.gap for f in j.flips if f.gap is not None]
    print("largest reference gap at a candidate flip:", max(known) if known else None)
    print("statuses:", {k: v for k, v in comparison.summary.counts.items() if v})


if __name__ == "__main__":
    main()
