"""A near-tie says how far its arms already drifted at the matched positions before the flip,
from both runs' own logprobs (no drift pass needed), in every report format."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from helpers import rec, step, write_run
from rich.console import Console

from strict_gate.judge.compare import Status, compare_prompt
from strict_gate.judge.prefix_drift import DriftScale, PrefixDrift, prefix_drift
from strict_gate.offline.compare import compare_run_dirs
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
    assert pc.prefix_drift.scale == DriftScale.BEYOND_HALF_PRECISION
    assert prefix_drift(ref, cand, 0) is None  # no matched position, no figure
    assert prefix_drift(ref, replace(cand, top_logprobs=None), 2) is None  # no logprobs, no figure


@pytest.mark.parametrize("x, scale", [(3e-5, DriftScale.FLOAT32_ROUNDING), (1e-3, DriftScale.FLOAT32_ROUNDING),
                                      (0.004, DriftScale.HALF_PRECISION), (0.05, DriftScale.HALF_PRECISION),
                                      (0.28, DriftScale.BEYOND_HALF_PRECISION)])
def test_scales(x, scale):
    assert DriftScale.of(x) == scale


def test_every_report_says_the_scale_of_a_near_tie(tmp_path):
    pairs = {name: _pair(name, delta) for name, delta in DRIFTS.items()}
    ref = write_run(tmp_path / "ref", [r for r, _ in pairs.values()])
    cand = write_run(tmp_path / "cand", [c for _, c in pairs.values()])
    result = compare_run_dirs(ref, cand, policy="near-tie", out=tmp_path / "out")
    q8 = "near-tie (drift 0.28 at matched positions: beyond half precision)"
    fp16 = "near-tie (drift 0.004 at matched positions: at half-precision level)"
    fp32 = "near-tie (drift 3e-05 at matched positions: at float32 rounding level)"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    by_id = {p["id"]: p for p in report["prompts"]}
    assert by_id["q8"]["label"] == q8 and by_id["fp16"]["label"] == fp16 and by_id["fp32"]["label"] == fp32
    assert by_id["q8"]["matched_drift"] == {"max_abs_dlogprob": pytest.approx(0.28), "positions": 2,
                                            "scale": "beyond-half-precision"}
    assert by_id["q8"]["status"] == "near_tie"  # the status (and the verdict) do not change
    md = (tmp_path / "out" / "report.md").read_text()
    assert q8 in md and fp16 in md and fp32 in md
    assert "2 of 3 near-tie(s) came with drift above float32 rounding level" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert q8 in html
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=120))
    out = buf.getvalue()
    assert "drift 0.28 beyond half precision" in out and "drift 3e-05 at float32 rounding level" in out


def test_the_label_is_the_same_with_and_without_the_drift_pass(tmp_path):
    """The drift pass's figure (it includes the divergence position) must not move the label:
    on main a fp32-level tie read "half-precision" once `drift = true` was set."""
    from strict_gate.drift.measure import DriftReport, PromptDrift, Stats
    from strict_gate.judge.result import status_label, to_json, with_feature

    ref, cand = _pair("fp32", DRIFTS["fp32"])
    result = compare_run_dirs(write_run(tmp_path / "ref", [ref]), write_run(tmp_path / "cand", [cand]),
                              policy="near-tie")
    none = Stats(None, None, None)
    drift = DriftReport(band=0.5, k=2, positions=3, same_top1=2, abs_dlogprob=none, kl=none,
                        min_reference_margin=None, positions_within_band=0,
                        prompts={"fp32": PromptDrift("fp32", positions=3, drift_before_divergence=0.01)})
    p = result.comparison.prompts[0]
    with_pass = with_feature(result, "drift", drift)
    assert status_label(with_pass, p) == status_label(result, p) == (
        "near-tie (drift 3e-05 at matched positions: at float32 rounding level)")
    assert to_json(with_pass)["prompts"][0]["matched_drift"] == to_json(result)["prompts"][0]["matched_drift"]


def test_drift_over_a_runs_arrays_equals_the_step_by_step_figure():
    """Records read from disk carry their top-k as arrays (TopSteps): prefix_drift and the
    chosen logprobs report.html shows are computed on them at once, to the same figures as
    the step-by-step reading (a token missing from one side's step, a ragged width)."""
    from strict_gate.runs.audit import StepTable
    from strict_gate.runs.records import TopSteps

    def arrays(r):
        t = StepTable.from_steps(r.top_logprobs)
        return replace(r, top_logprobs=TopSteps(t.ids, t.lps, t.width))

    ref, cand = _pair("a", 0.004)
    cand = replace(cand, top_logprobs=(step((1, -0.1)), *cand.top_logprobs[1:]))  # width 1 at step 0
    ref = replace(ref, top_logprobs=(ref.top_logprobs[0], step((4, -0.2), (9, -4.0)), ref.top_logprobs[2]))  # 3 unlisted
    for d in (0, 1, 2, 3):
        assert prefix_drift(arrays(ref), arrays(cand), d) == prefix_drift(ref, cand, d)
    for r in (ref, cand):
        want = [r.logprob_at(i, t) for i, t in enumerate(r.token_ids)]
        assert arrays(r).logprobs_at(r.token_ids) == r.logprobs_at(r.token_ids) == want
