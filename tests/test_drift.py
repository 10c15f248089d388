"""The drift math on hand-built records and scored steps: no engine, no torch."""

import math

import numpy as np
import pytest
from helpers import gate_text, rec, step

from strict_gate.drift.measure import KL_ESTIMATOR, DriftReport, kl_topk_union, measure_drift, prompt_drift
from strict_gate.errors import ConfigError
from strict_gate.gate.config import parse_gate_config
from strict_gate.judge.prefix_drift import DriftScale
from strict_gate.runs.records import ScoredStep


def scored(token, *pairs, logprob=None):
    top = step(*pairs)
    if logprob is None:
        logprob = next((lp for t, lp in top if t == token), None)
    return ScoredStep(token_id=token, logprob=logprob, top=top)


def kl_exact(p: dict, q: dict) -> float:
    return sum(pv * math.log(pv / q[t]) for t, pv in p.items() if pv > 0)


def test_identical_steps_have_zero_drift():
    tops = [step((1, -0.1), (2, -2.5), (3, -3.0)), step((5, -0.7), (6, -0.9), (7, -4.0))]
    r = rec("a", [1, 5], tops=tops)
    d = prompt_drift(r, [scored(1, *tops[0]), scored(5, *tops[1])], k=3, band=0.5)
    assert d.positions == 2 and d.same_top1 == 2 and d.same_top1_rate == 1.0
    assert d.abs_dlogprob.max == 0.0 and d.kl.max == pytest.approx(0.0, abs=1e-12)
    assert d.min_reference_margin == pytest.approx(0.2) and d.positions_within_band == 1
    assert d.first_top1_difference is None


def test_same_top1_counting_dlogprob_and_margin():
    tops = [step((1, -0.1), (2, -2.5)), step((3, -0.6), (4, -0.8)), step((5, -0.01), (6, -5.0))]
    r = rec("a", [1, 3, 5], tops=tops)
    steps = [
        scored(1, (1, -0.2), (2, -2.0)),  # same top-1, |Δ| 0.1
        scored(3, (4, -0.65), (3, -0.7)),  # flipped: the candidate would pick 4 here
        scored(5, (5, -0.01), (6, -5.5)),
    ]
    d = prompt_drift(r, steps, k=2, band=0.5)
    assert d.same_top1 == 2 and d.first_top1_difference == 1
    assert d.abs_dlogprob.max == pytest.approx(0.1) and d.abs_dlogprob.mean == pytest.approx(0.2 / 3)
    assert d.min_reference_margin == pytest.approx(0.2) and d.positions_within_band == 1


def test_p99_is_numpy_linear_percentile_over_all_positions():
    n = 200
    tops = [step((1, -0.1), (2, -3.0)) for _ in range(n)]
    deltas = np.linspace(0.0, 0.5, n)
    r = rec("a", [1] * n, tops=tops)
    steps = [scored(1, (1, -0.1 - x), (2, -3.0)) for x in deltas]
    d = prompt_drift(r, steps, k=2, band=0.5)
    assert d.abs_dlogprob.p99 == pytest.approx(float(np.percentile(deltas, 99)), abs=1e-9)
    assert d.abs_dlogprob.max == pytest.approx(0.5)


def test_kl_equals_exact_kl_when_both_lists_cover_the_union():
    """Same token sets: the estimator is the exact KL over those tokens plus the rest bucket."""
    p = {1: 0.6, 2: 0.3, 3: 0.05}
    q = {1: 0.5, 2: 0.35, 3: 0.1}
    rt = [step(*((t, math.log(v)) for t, v in p.items()))]
    ct = [step(*((t, math.log(v)) for t, v in q.items()))]
    want = kl_exact(p | {"rest": 0.05}, q | {"rest": 0.05})
    assert kl_topk_union(rt, ct, 3)[0] == pytest.approx(want, rel=1e-9)


def test_kl_fills_a_missing_token_at_the_kth_logprob():
    rt = [step((1, math.log(0.7)), (2, math.log(0.2)))]  # the candidate's token 3 is missing here: 0.2
    ct = [step((1, math.log(0.6)), (3, math.log(0.3)))]  # the reference's token 2 is missing here: 0.3
    p = {1: 0.7, 2: 0.2, 3: 0.2}
    q = {1: 0.6, 2: 0.3, 3: 0.3}
    ps, qs = sum(p.values()), sum(q.values())  # both exceed 1: renormalised, rest at the floor
    p = {t: v / (ps + 1e-10) for t, v in p.items()} | {"rest": 1e-10 / (ps + 1e-10)}
    q = {t: v / (qs + 1e-10) for t, v in q.items()} | {"rest": 1e-10 / (qs + 1e-10)}
    assert kl_topk_union(rt, ct, 2)[0] == pytest.approx(kl_exact(p, q), rel=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_kl_is_never_negative(seed):
    rng = np.random.default_rng(seed)
    rt, ct = [], []
    for _ in range(50):
        for out in (rt, ct):
            ids = rng.choice(12, size=4, replace=False)
            lps = np.log(np.maximum(rng.dirichlet(np.ones(12) * rng.uniform(0.05, 2.0)), 1e-30))[:4]
            out.append(step(*zip(ids.tolist(), lps.tolist())))
    kl = kl_topk_union(rt, ct, 4)
    assert (kl >= 0).all() and np.isfinite(kl).all()


def test_totals_and_missing_prompts_are_stated():
    tops = [step((1, -0.1), (2, -2.5))]
    refs = {"a": rec("a", [1], tops=tops), "b": rec("b", [1], tops=tops), "c": rec("c", [], error="boom")}

    def score(r):
        if r.id == "b":
            raise RuntimeError("scoring exploded")
        return [scored(1, (1, -0.3), (2, -2.0))]

    d = measure_drift(refs, ["a", "b", "c", "gone"], score, k=2, band=0.5, scored_by="hand")
    j = d.to_json()
    assert j["positions"] == 1 and j["same_top1_rate"] == 1.0
    assert j["abs_dlogprob"]["max"] == pytest.approx(0.2)
    assert j["kl"]["estimator"] == KL_ESTIMATOR and j["kl"]["max"] > 0
    assert j["prompts_scored"] == 1 and set(j["prompts_missing"]) == {"b", "c", "gone"}
    assert "scoring exploded" in j["prompts"]["b"]["error"] and "abs_dlogprob" not in j["prompts"]["b"]
    assert j["prompts"]["a"]["positions"] == 1 and j["min_reference_margin"] == pytest.approx(2.4)
    assert DriftReport.from_json(j).to_json() == j  # what `strict-gate diagnose` keeps


def test_a_short_or_empty_scoring_is_missing_not_zero():
    tops = [step((1, -0.1), (2, -2.5)), step((1, -0.1), (2, -2.5))]
    r = rec("a", [1, 1], tops=tops)
    assert "scored 1 of 2" in prompt_drift(r, [scored(1, (1, -0.1), (2, -2.5))], k=2, band=0.5).error
    empty = ScoredStep(token_id=1, logprob=-0.1, top=())
    d = prompt_drift(r, [empty, empty], k=2, band=0.5)
    assert d.error and d.to_json() == {"id": "a", "error": d.error}


def test_drift_beyond_half_precision_before_a_flip():
    tops = [step((1, -0.1), (2, -2.5)), step((3, -0.6), (4, -0.65))]
    refs = {"noisy": rec("noisy", [1, 3], tops=tops), "clean": rec("clean", [1, 3], tops=tops)}
    steps = {
        "noisy": [scored(1, (1, -0.11), (2, -2.5)), scored(3, (4, -0.6), (3, -0.62))],
        "clean": [scored(1, (1, -0.1 - 1e-7), (2, -2.5)), scored(3, (4, -0.6), (3, -0.6 - 1e-7))],
    }
    d = measure_drift(refs, ["noisy", "clean"], lambda r: steps[r.id], k=2, band=0.5)
    d = d.with_divergences({"noisy": 0, "clean": 0})
    assert d.prompts["noisy"].drift_before_divergence == pytest.approx(0.01)
    assert d.prompts["clean"].drift_before_divergence == pytest.approx(1e-7, abs=1e-9)
    assert DriftScale.of(0.01) == DriftScale.HALF_PRECISION and DriftScale.of(1e-7) == DriftScale.FLOAT32_ROUNDING
    assert d.to_json()["prompts"]["noisy"]["max_abs_dlogprob_before_divergence"] == pytest.approx(0.01)


def test_drift_key_is_a_bool_defaulting_to_false():
    def base(**top):
        return gate_text(prompts="p.jsonl", reference={"kind": "recorded", "path": "x"},
                         candidate={"kind": "recorded", "path": "y"}, **top)

    assert parse_gate_config(base(), "g.toml").drift is False
    assert parse_gate_config(base(drift=True), "g.toml").drift is True
    with pytest.raises(ConfigError, match="drift"):
        parse_gate_config(base(drift="yes"), "g.toml")
