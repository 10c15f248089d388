"""Comparator and policies on hand-built runs: every status, both gaps, edges."""

import pytest
from helpers import confident, rec, step

from strict_gate.errors import ConfigError
from strict_gate.judge.cascade import CandidateView, ScoredPosition, judge_later
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.policy import apply_policy


def cmp(ref, cand, band=0.5, ids=None):
    R = {r.id: r for r in ref}
    C = {c.id: c for c in cand}
    return compare_runs(R, C, band=band, prompt_ids=ids), R, C


def flip(ref_gap, cand_gap, *, cand_has_ref=True, ref_has_cand=True):
    """Reference picks 10 then 11; candidate picks 20 at position 1. Gaps as given."""
    r_top = [(20, -0.5), (99, -5.0)]
    if ref_has_cand:
        r_top.append((21, -0.5 - ref_gap))
    c_top = [(21, -0.5), (99, -5.0)]
    if cand_has_ref:
        c_top.append((20, -0.5 - cand_gap))
    ref = rec("p", [10, 20, 30], tops=[confident(10), step(*r_top), confident(30)])
    cand = rec("p", [10, 21, 30], tops=[confident(10), step(*c_top), confident(30)])
    return ref, cand


def test_match():
    c, *_ = cmp([rec("a", [1, 2, 3])], [rec("a", [1, 2, 3])])
    p = c.prompts[0]
    assert (p.status, p.matched_positions, p.prefix_length, p.first_divergence) == ("match", 3, 3, None)
    assert c.summary.prompts_exact == 1 and c.summary.positions_matched == 3 == c.summary.positions_total


def test_near_tie_both_gaps_within_band():
    ref, cand = flip(0.1, 0.2)
    c, *_ = cmp([ref], [cand])
    p = c.prompts[0]
    assert p.status == "near_tie"
    d = p.first_divergence
    assert d.position == 1 and d.reference_token == 20 and d.candidate_token == 21
    assert d.reference_gap == pytest.approx(0.1) and d.candidate_gap == pytest.approx(0.2)
    assert p.matched_positions == 2 and p.prefix_length == 1


def test_band_edge_is_inclusive_and_one_side_over_is_divergent():
    ref, cand = flip(0.5, 0.5)
    assert cmp([ref], [cand])[0].prompts[0].status == "near_tie"
    ref, cand = flip(0.5, 0.51)
    p = cmp([ref], [cand])[0].prompts[0]
    assert p.status == "divergent" and "candidate gap" in p.first_divergence.reason
    ref, cand = flip(0.6, 0.1)
    p = cmp([ref], [cand])[0].prompts[0]
    assert p.status == "divergent" and "reference gap" in p.first_divergence.reason


def test_band_is_configurable():
    ref, cand = flip(0.4, 0.4)
    assert cmp([ref], [cand], band=0.25)[0].prompts[0].status == "divergent"
    assert cmp([ref], [cand], band=1.0)[0].prompts[0].status == "near_tie"


def test_null_gaps_never_make_a_near_tie():
    ref, cand = flip(0.01, 0.01, ref_has_cand=False)
    p = cmp([ref], [cand])[0].prompts[0]
    assert p.status == "divergent" and p.first_divergence.reference_gap is None
    assert "outside the reference's top" in p.first_divergence.reason
    ref, cand = flip(0.01, 0.01, cand_has_ref=False)
    p = cmp([ref], [cand])[0].prompts[0]
    assert p.status == "divergent" and p.first_divergence.candidate_gap is None


def test_missing_logprobs_is_divergent_with_reason():
    ref, _ = flip(0.01, 0.01)
    cand = rec("p", [10, 21, 30], tops=None)
    cand = cand.__class__(**{**cand.__dict__, "top_logprobs": None})
    p = cmp([ref], [cand])[0].prompts[0]
    assert p.status == "divergent"
    assert "candidate run has no logprobs" in p.first_divergence.reason


def test_length_mismatch_is_not_a_silent_pass():
    c, *_ = cmp([rec("a", [1, 2, 3])], [rec("a", [1, 2], finish="stop")])
    p = c.prompts[0]
    assert p.status == "length_mismatch" and p.first_divergence.position == 2
    assert p.first_divergence.candidate_token is None and p.first_divergence.reference_token == 3
    assert c.summary.positions_total == 3 and c.summary.positions_matched == 2
    c, *_ = cmp([rec("a", [1, 2])], [rec("a", [1, 2, 3])])
    assert c.prompts[0].status == "length_mismatch"


def test_tokenization_mismatch_checked_first():
    c, *_ = cmp([rec("a", [1, 2], prompt=(1, 5, 6))], [rec("a", [1, 2], prompt=(5, 6))])
    p = c.prompts[0]
    assert p.status == "tokenization_mismatch" and "index 0" in p.detail
    assert p.matched_positions == 0


def test_missing_and_error():
    c, *_ = cmp([rec("a", [1]), rec("b", [2])], [rec("a", [1], error="boom")], ids=["a", "b", "z"])
    st = {p.id: p.status for p in c.prompts}
    assert st == {"a": "error", "b": "missing", "z": "missing"}
    assert "candidate failed: boom" in c.prompts[0].detail


def test_summary_122_of_128_shape():
    # 7 exact prompts of 16 and one that diverges at 6 and re-aligns for 4 tokens later.
    ref = [rec(f"p{i}", range(100 * i, 100 * i + 16)) for i in range(8)]
    cand = list(ref[:7])
    r7 = list(range(700, 716))
    c7 = r7[:6] + [9001, 9002, 9003, 9004, 9005, 9006] + r7[12:]
    cand.append(rec("p7", c7))
    c, *_ = cmp(ref, cand)
    s = c.summary
    assert (s.prompts_exact, s.prompts_total) == (7, 8)
    assert (s.positions_matched, s.positions_total, s.prefix_positions) == (122, 128, 118)
    assert s.counts["divergent"] == 1


# ---------------------------------------------------------------- policies


def verdict(ref, cand, policy, problems=()):
    c, R, C = cmp(ref, cand)
    return apply_policy(c, policy, R, C, run_problems=problems)


def test_strict_fails_a_near_tie_but_near_tie_policy_passes_it():
    ref, cand = flip(0.1, 0.1)
    v = verdict([ref, rec("b", [1])], [cand, rec("b", [1])], "strict")
    assert v.verdict == "fail" and v.exit_code == 1
    assert "near-tie fails under strict" in v.prompts[0].reason
    c, R, C = cmp([ref, rec("b", [1])], [cand, rec("b", [1])])
    follows = judge_later(1, 3, [ScoredPosition(2, 30, 0.0, 30)], c.band, candidate=CandidateView())
    v = apply_policy(c, "near-tie", R, C, later={"p": follows})
    assert v.verdict == "pass" and v.exit_code == 0


def test_a_near_tie_whose_later_tokens_were_never_judged_is_unverified():
    ref, cand = flip(0.1, 0.1)  # position 2 follows the flip, and nothing re-scored it
    v = verdict([ref, rec("b", [1])], [cand, rec("b", [1])], "near-tie")
    assert v.verdict == "incomplete" and v.exit_code == 3
    assert v.prompts[0].unverified and not v.prompts[0].passed
    assert "position 2 after the flip not judged" in v.prompts[0].reason


def test_near_tie_policy_fails_divergent():
    ref, cand = flip(2.0, 0.1)
    assert verdict([ref], [cand], "near-tie").verdict == "fail"


def test_zero_prompts_is_never_a_pass():
    for policy in ("strict", "near-tie", "auto"):
        v = verdict([], [], policy)
        assert v.verdict == "incomplete" and v.exit_code == 3
        assert "zero prompts" in v.reasons[0]


def test_missing_prompt_makes_incomplete_and_failure_wins():
    v = verdict([rec("a", [1]), rec("b", [2])], [rec("a", [1])], "strict")
    assert v.verdict == "incomplete"
    v = verdict([rec("a", [1]), rec("b", [2])], [rec("a", [7])], "strict")
    assert v.verdict == "fail"


def test_engine_problem_forces_incomplete():
    v = verdict([rec("a", [1])], [rec("a", [2])], "strict", problems=("candidate engine failed: died",))
    assert v.verdict == "incomplete" and "candidate engine failed: died" in v.reasons


def test_distributional_needs_samples():
    with pytest.raises(ConfigError, match="needs the reference's samples"):
        verdict([rec("a", [1, 2])], [rec("a", [1, 2])], "distributional")


def test_distributional_accepts_any_reference_sample():
    ref = rec("a", [1, 2], samples=[[1, 2], [1, 3], [1, 2]])
    assert verdict([ref], [rec("a", [1, 3])], "distributional").verdict == "pass"
    assert verdict([ref], [rec("a", [1, 4])], "distributional").verdict == "fail"


def test_auto_strict_where_samples_agree_distributional_where_they_disagree():
    det = rec("a", [1, 2], samples=[[1, 2]] * 5)
    nondet = rec("b", [5, 6], samples=[[5, 6], [5, 7], [5, 6], [5, 6], [5, 6]])
    v = verdict([det, nondet], [rec("a", [1, 2]), rec("b", [5, 7])], "auto")
    rules = {p.id: p.rule for p in v.prompts}
    assert rules == {"a": "strict", "b": "distributional"} and v.verdict == "pass"
    v = verdict([det, nondet], [rec("a", [1, 3]), rec("b", [5, 7])], "auto")
    assert v.verdict == "fail"


def test_auto_without_samples_says_so():
    v = verdict([rec("a", [1])], [rec("a", [1])], "auto")
    assert v.verdict == "pass"
    assert any("determinism is unmeasured" in n for n in v.notes)


def test_unknown_policy():
    with pytest.raises(ConfigError, match="unknown policy"):
        verdict([rec("a", [1])], [rec("a", [1])], "lenient")


def test_a_rule_entered_in_the_mapping_is_a_policy(monkeypatch):
    """A new policy is its file and its entry in RULES: the Policy names, the check and the
    verdict take it from there (judge/policy.py built afresh, as the next import would)."""
    import importlib.util
    import sys
    from dataclasses import dataclass

    from strict_gate.judge import policy
    from strict_gate.judge.policies import RULES
    from strict_gate.judge.policies.rule import Rule, Ruling

    @dataclass(frozen=True)
    class Lenient(Rule):
        def judge(self, case):
            return Ruling(True, f"lenient about {case.prompt.status}")

    monkeypatch.setitem(RULES, "lenient", Lenient("lenient", "every compared prompt passes", caveat="says nothing"))
    spec = importlib.util.spec_from_file_location("fresh_policy", policy.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fresh_policy", fresh)
    spec.loader.exec_module(fresh)
    assert fresh.check_policy("lenient") is fresh.Policy.LENIENT
    c, R, C = cmp([rec("a", [1])], [rec("a", [2])])
    v = fresh.apply_policy(c, "lenient", R, C)
    assert v.verdict == "pass" and v.prompts[0].reason == "lenient about divergent"
    assert v.policy_words == "lenient (says nothing)" and v.notes == ("policy lenient: says nothing",)
