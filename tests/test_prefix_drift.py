"""A near-tie says how far its arms already drifted at the matched positions before the flip,
from both runs' own logprobs (no drift pass needed), in every report format."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from helpers import rec, step, write_run
from rich.console import Console

from strict_gate.gate.run import compare_run_dirs
from strict_gate.judge.compare import Status, compare_prompt
from strict_gate.judge.prefix_drift import DriftScale, PrefixDrift, prefix_drift
from strict_gate.report.console import print_result

# the prefix drift of three builds, as measured: float32, float16, Q8_0
DRIFTS = {"fp32": 3e-5, "fp16": 0.004, "q8": 0.28}


def _pair(pid: str, delta: float):
    """Two records that agree on tokens 1, 3 (candidate logprobs off by `delta`) and flip a
    near-tie at position 2."""
    ref = rec(pid, [1, 3, 5], tops=[step((1, -0.1), (9, -4.0)), step((3, -0.2), (9, -4.0)),
                                   step((5, -0.60), (6, -0.62))])
    cand = rec(pid, [1, 3, 6], tops=[step((1, -0.1 - delta), (9, -4.0)), step((3, -0.2 + delta / 2), (9, -4.0)),
                                    step((6, -0.60), (5, -0.61))])
    return ref, cand


def test_prefix_drift_is_the_largest_chosen_token_difference_before_the_flip():
    ref, cand = _pair("a", 0.28)
    pc = compare_prompt("a", ref, cand, band=0.5)
    assert pc.status == Status.NEAR_TIE
    assert pc.prefix_drift == PrefixDrift(pytest.approx(0.28), 2)
    assert pc.prefix_drift.scale == DriftScale.QUANTISATION
    assert prefix_drift(ref, cand, 0) is None  # no matched position, no figure
    assert prefix_drift(ref, replace(cand, top_logprobs=None), 2) is None  # no logprobs, no figure


@pytest.mark.parametrize("x, scale", [(3e-5, DriftScale.REDUCTION_ORDER), (1e-3, DriftScale.REDUCTION_ORDER),
                                      (0.004, DriftScale.HALF_PRECISION), (0.05, DriftScale.HALF_PRECISION),
                                      (0.28, DriftScale.QUANTISATION)])
def test_scales(x, scale):
    assert DriftScale.of(x) == scale


def test_every_report_says_the_scale_of_a_near_tie(tmp_path):
    pairs = {name: _pair(name, delta) for name, delta in DRIFTS.items()}
    ref = write_run(tmp_path / "ref", [r for r, _ in pairs.values()])
    cand = write_run(tmp_path / "cand", [c for _, c in pairs.values()])
    result = compare_run_dirs(ref, cand, policy="near-tie", out=tmp_path / "out")
    q8 = "near-tie, with quantisation-level drift (max |Δlogprob| 0.28 at matched positions)"
    fp16 = "near-tie, with half-precision-level drift (max |Δlogprob| 0.004 at matched positions)"
    fp32 = "near-tie (reduction-order drift 3e-05)"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    by_id = {p["id"]: p for p in report["prompts"]}
    assert by_id["q8"]["label"] == q8 and by_id["fp16"]["label"] == fp16 and by_id["fp32"]["label"] == fp32
    assert by_id["q8"]["matched_drift"] == {"max_abs_dlogprob": pytest.approx(0.28), "positions": 2,
                                            "scale": "quantisation-level"}
    assert by_id["q8"]["status"] == "near_tie"  # the status (and the verdict) do not change
    md = (tmp_path / "out" / "report.md").read_text()
    assert q8 in md and fp16 in md and fp32 in md
    assert "2 of 3 near-tie(s) came with drift above float32 noise" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert "quantisation-level drift (max |Δlogprob| 0.28" in html
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=120))
    out = buf.getvalue()
    assert "quantisation drift 0.28" in out and "reduction-order drift 3e-05" in out
