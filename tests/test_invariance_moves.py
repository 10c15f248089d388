"""The candidate judged against the reference's own moves (issue 52, invariance/moves.py): each
prompt of a variant both arms ran classified by the pair of moves, from stored runs judged by
the gate's comparator, and the candidate's verdict counting its own moves alone.

The runs are written by hand (tests/helpers.py); the hostile engines are in
test_adversarial_invariance_moves.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers import rec, step, write_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strict_gate.invariance.config import InvariancePolicy
from strict_gate.invariance.load import load_invariance
from strict_gate.invariance.moves import own_moves, paired, pairing, same_way
from strict_gate.invariance.render import beside_line, markdown_section, moves
from strict_gate.invariance.verdict import (
    InvarianceResult,
    Moved,
    Pairing,
    VariantResult,
    VariantVerdict,
    judge_variant,
    not_run,
)
from strict_gate.judge.compare import Status
from strict_gate.nightly.diff import Rule, diff_reports
from strict_gate.runs.reader import load_run

BASE = {"p0": [1, 2, 3, 4], "p1": [5, 6, 7, 8], "p2": [9, 10, 11, 12], "p3": [13, 14, 15, 16]}
STRICT, NEAR, INFO = InvariancePolicy.STRICT, InvariancePolicy.NEAR_TIE, InvariancePolicy.INFORMATIONAL


def _moved(moves: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    """BASE with each named prompt's token at a position replaced: id -> (position, new token)."""
    out = {pid: list(toks) for pid, toks in BASE.items()}
    for pid, (at, token) in moves.items():
        out[pid][at] = token
    return out


def _run(path: Path, seqs: dict[str, list[int]], gap: float):
    """Every step's runner-up `gap` nats below: a flip at 0.1 is a near-tie, at 3 a dependence."""
    return load_run(write_run(path, [rec(pid, toks, tops=[step((t, -0.01), (t + 1, -0.01 - gap), (t + 900, -6.0))
                                                           for t in toks]) for pid, toks in seqs.items()]))


def _arm(tmp: Path, arm: str, moves: dict[str, tuple[int, int]], policy=STRICT, gap: float = 3.0,
         name: str = "chunked_prefill-2") -> VariantResult:
    base = _run(tmp / f"{arm}-{name}-base", BASE, gap)
    var = _run(tmp / f"{arm}-{name}-run", _moved(moves), gap)
    return judge_variant(name, arm, base, [var], policy=policy, band=0.5, cause="prefill-chunk")


def _inv(tmp: Path, cand: dict, ref: dict | None, policy=STRICT, gap: float = 3.0) -> InvarianceResult:
    variants = [_arm(tmp, "candidate", cand, policy, gap)]
    variants += [] if ref is None else [_arm(tmp, "reference", ref, policy, gap)]
    return InvarianceResult(policy, 0.5, {}, tuple(variants), {})


def _classes(v: VariantResult) -> dict[str, Pairing]:
    return dict(v.pairs or ())


# -- each case, from stored runs


def test_a_candidate_that_moves_exactly_where_the_reference_moves_passes(tmp_path):
    inv = paired(_inv(tmp_path, {"p0": (2, 5), "p2": (1, 40)}, {"p0": (2, 5), "p2": (1, 40)}))
    cand, ref = inv.variants
    assert _classes(cand) == {"p0": Pairing.WITH_REFERENCE, "p2": Pairing.WITH_REFERENCE}
    assert cand.verdict == VariantVerdict.PASS and cand.prompts_exact == 2  # the figures stay what they are
    assert ref.verdict == VariantVerdict.YARDSTICK and inv.verdict == VariantVerdict.PASS and inv.exit_code == 0
    assert own_moves(cand) == ()


def test_a_candidate_that_moves_where_the_reference_stays_fails(tmp_path):
    inv = paired(_inv(tmp_path, {"p0": (2, 5), "p1": (3, 77)}, {"p0": (2, 5)}))
    cand, ref = inv.variants
    assert _classes(cand) == {"p0": Pairing.WITH_REFERENCE, "p1": Pairing.CANDIDATE_ONLY}
    assert cand.verdict == VariantVerdict.FAIL and inv.exit_code == 5
    assert [m.id for m in own_moves(cand)] == ["p1"]
    assert ref.verdict == VariantVerdict.YARDSTICK
    assert "NOT INVARIANT (candidate:chunked_prefill-2)" in inv.verdict_line


def test_a_reference_that_moves_alone_is_shown_as_its_own_and_never_counted(tmp_path):
    inv = paired(_inv(tmp_path, {}, {"p3": (0, 99)}))
    cand, ref = inv.variants
    assert _classes(cand) == {"p3": Pairing.REFERENCE_ONLY} and cand.verdict == VariantVerdict.PASS
    assert inv.exit_code == 0 and ref.verdict == VariantVerdict.YARDSTICK
    ((m, words),) = moves(cand)
    assert m.id == "p3" and words == ("the reference moves, the candidate does not: the reference's "
                                      "prefill-chunk dependence at position 0")
    assert "the reference moves, the candidate does not: 1" in beside_line(cand)


@pytest.mark.parametrize(("cand", "ref", "why"), [
    ({"p0": (2, 5)}, {"p0": (1, 5)}, "another position"),
    ({"p0": (2, 5)}, {"p0": (2, 6)}, "another token at the same position"),
])
def test_both_moving_differently_is_a_finding(tmp_path, cand, ref, why):
    inv = paired(_inv(tmp_path, cand, ref))
    c = inv.variants[0]
    assert _classes(c) == {"p0": Pairing.DIFFERENTLY}, why
    assert c.verdict == VariantVerdict.FAIL and inv.exit_code == 5
    assert "both move differently (the reference's: prefill-chunk dependence at position" in \
        "\n".join(markdown_section(inv))


def test_the_same_flip_with_other_tokens_after_it_moves_differently(tmp_path):
    """Same position, same new token, then the candidate's continuation parts from the
    reference's: not the reference's move (its tokens are not vLLM's under the variant)."""
    base = _run(tmp_path / "cb", BASE, 3.0)
    cand = judge_variant("batch-4", "candidate", base, [_run(tmp_path / "cv", _moved({"p0": (1, 50)}) | {
        "p0": [1, 50, 60, 4]}, 3.0)], policy=STRICT, band=0.5)
    ref = judge_variant("batch-4", "reference", base, [_run(tmp_path / "rv", _moved({"p0": (1, 50)}), 3.0)],
                        policy=STRICT, band=0.5)
    c, r = cand.divergences[0], ref.divergences[0]
    assert (c.position, c.variant_token) == (r.position, r.variant_token) == (1, 50)
    assert not same_way(c, r) and pairing(c, r) == Pairing.DIFFERENTLY


def test_the_same_new_tokens_from_another_batch_1_token_move_differently():
    """The candidate's batch-1 run had another token at the flip (its token verdict's business):
    the variants agree, the moves do not (one changed 3 into 50, the other 30 into 50)."""
    c = _m("p0", 2, 50)
    r = replace(c, baseline_token=30, baseline_tokens=(1, 2, 30, 4))
    assert not same_way(c, r) and pairing(c, r) == Pairing.DIFFERENTLY and same_way(c, c)


def test_a_candidate_variant_that_did_not_run_says_nothing_of_the_references_moves(tmp_path):
    ref = _arm(tmp_path, "reference", {"p0": (2, 5)})
    inv = paired(InvarianceResult(STRICT, 0.5, {}, (not_run(ref.name, "candidate", "no start"), ref), {}))
    assert inv.variants[0].pairs is None and inv.variants[1].verdict == VariantVerdict.YARDSTICK
    assert inv.exit_code == 3


def test_over_repeats_a_candidate_that_moves_two_ways_does_not_move_with_the_reference(tmp_path):
    """Its first run moves p0 as the reference does and is the one reported (the same rank); its
    second moves p0 another way: the reported run does not say all its moves, so no excuse."""
    base = _run(tmp_path / "cb", BASE, 3.0)
    runs = [_run(tmp_path / f"cv{k}", _moved({"p0": at}), 3.0) for k, at in enumerate(((2, 5), (1, 40)))]
    cand = judge_variant("batch-4", "candidate", base, runs, policy=STRICT, band=0.5)
    once = judge_variant("batch-4", "candidate", base, runs[:1], policy=STRICT, band=0.5)
    ref = _arm(tmp_path, "reference", {"p0": (2, 5)}, name="batch-4")
    (c,), (r,) = cand.divergences, ref.divergences
    assert (c.run, c.position, c.outputs) == (1, 2, 3) and c.variant_tokens == r.variant_tokens
    assert pairing(c, r) == Pairing.DIFFERENTLY and pairing(once.divergences[0], r) == Pairing.WITH_REFERENCE
    inv = paired(InvarianceResult(STRICT, 0.5, {}, (cand, ref), {}))
    assert inv.variants[0].verdict == VariantVerdict.FAIL and load_invariance(inv.to_json()) == inv


def test_under_policy_near_tie_a_shared_move_beyond_the_band_passes(tmp_path):
    inv = paired(_inv(tmp_path, {"p1": (0, 70)}, {"p1": (0, 70)}, policy=NEAR))
    assert inv.variants[0].verdict == VariantVerdict.PASS and inv.exit_code == 0


def test_under_policy_near_tie_the_candidates_own_dependence_fails(tmp_path):
    inv = paired(_inv(tmp_path, {"p1": (0, 70), "p2": (0, 71)}, {"p1": (0, 70)}, policy=NEAR))
    assert inv.variants[0].verdict == VariantVerdict.FAIL and inv.exit_code == 5


def test_under_informational_its_own_move_is_reported_and_exits_0(tmp_path):
    inv = paired(_inv(tmp_path, {"p1": (0, 70)}, {}, policy=INFO))
    assert inv.variants[0].verdict == VariantVerdict.FAIL and inv.exit_code == 0
    assert "the candidate moves where the reference stays" in "\n".join(markdown_section(inv))


def test_a_variant_neither_arm_moved_is_paired_silently(tmp_path):
    inv = paired(_inv(tmp_path, {}, {}))
    c = inv.variants[0]
    assert c.pairs == () and beside_line(c) is None and inv.exit_code == 0
    assert c.to_json()["beside_reference"] == {k.value: [] for k in Pairing}


def test_only_the_candidate_arm_changes_nothing(tmp_path):
    inv = _inv(tmp_path, {"p0": (2, 5)}, None)
    assert paired(inv) is inv and inv.variants[0].pairs is None
    assert inv.variants[0].to_json()["beside_reference"] is None and beside_line(inv.variants[0]) is None


def test_a_reference_variant_that_did_not_run_excuses_nothing(tmp_path):
    cand = _arm(tmp_path, "candidate", {"p0": (2, 5)})
    inv = paired(InvarianceResult(STRICT, 0.5, {}, (cand, not_run(cand.name, "reference", "no start")), {}))
    assert inv.variants[0].pairs is None and inv.variants[0].verdict == VariantVerdict.FAIL
    assert inv.variants[1].verdict == VariantVerdict.INCOMPLETE and inv.exit_code == 3


def test_a_prompt_the_reference_did_not_measure_excuses_nothing(tmp_path):
    base = _run(tmp_path / "rb", BASE, 3.0)
    lost = load_run(write_run(tmp_path / "rv", [rec(pid, toks) for pid, toks in _moved({"p0": (2, 5)}).items()
                                                if pid != "p0"] + [rec("p0", (), error="engine died")]))
    ref = judge_variant("chunked_prefill-2", "reference", base, [lost], policy=STRICT, band=0.5)
    inv = paired(InvarianceResult(STRICT, 0.5, {}, (_arm(tmp_path, "candidate", {"p0": (2, 5)}), ref), {}))
    cand = inv.variants[0]
    assert cand.pairs == () and cand.verdict == VariantVerdict.FAIL
    assert inv.variants[1].verdict == VariantVerdict.INCOMPLETE  # the reference's own run: never a yardstick


def test_a_failing_variant_with_unjudged_near_ties_stays_incomplete_once_its_moves_are_shared(tmp_path):
    c = _arm(tmp_path, "candidate", {"p0": (2, 5)})
    c = replace(c, problems=("chunked_prefill-2 run 1: p0: a near-tie at position 2; position 3 not judged",))
    inv = paired(InvarianceResult(STRICT, 0.5, {}, (c, _arm(tmp_path, "reference", {"p0": (2, 5)})), {}))
    assert inv.variants[0].verdict == VariantVerdict.INCOMPLETE and inv.exit_code == 3


# -- every case at once: the rule as a property


def _m(pid: str, at: int, new: int, status: Status = Status.DIVERGENT) -> Moved:
    toks = list(BASE[pid])
    toks[at] = new
    return Moved(pid, 1, status, at, BASE[pid][at], new, 3.0, 3.0, "r", tuple(BASE[pid]), tuple(toks))


MOVE = st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(50, 52), st.sampled_from(
    [Status.DIVERGENT, Status.NEAR_TIE])))
ARM = st.fixed_dictionaries({pid: MOVE for pid in BASE})


def _variant(arm: str, moves: dict, policy: InvariancePolicy) -> VariantResult:
    ds = tuple(_m(pid, *m[:2], m[2]) for pid, m in moves.items() if m is not None)
    fail = any(m.status != Status.NEAR_TIE or policy == STRICT for m in ds)
    return VariantResult("batch-4", arm, ("run",), 4, 4 - len(ds), 16, 16, 2 if ds else 1, len(ds), ds,
                         VariantVerdict.FAIL if fail else VariantVerdict.PASS)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cand=ARM, ref=ARM, policy=st.sampled_from([STRICT, NEAR]))
def test_the_candidate_fails_exactly_on_a_move_of_its_own_the_policy_fails(cand, ref, policy):
    inv = paired(InvarianceResult(policy, 0.5, {}, (_variant("candidate", cand, policy),
                                                    _variant("reference", ref, policy)), {}))
    c, r = inv.variants
    expected = {}
    for pid in BASE:
        x, y = cand[pid], ref[pid]
        if x is None and y is None:
            continue
        expected[pid] = (Pairing.REFERENCE_ONLY if x is None else Pairing.CANDIDATE_ONLY if y is None
                         else Pairing.WITH_REFERENCE if x[:2] == y[:2] else Pairing.DIFFERENTLY)
    assert _classes(c) == expected
    own = [pid for pid, k in expected.items() if k in (Pairing.CANDIDATE_ONLY, Pairing.DIFFERENTLY)]
    fails = any(cand[pid][2] != Status.NEAR_TIE or policy == STRICT for pid in own)
    assert c.verdict == (VariantVerdict.FAIL if fails else VariantVerdict.PASS)
    assert r.verdict in (VariantVerdict.PASS, VariantVerdict.YARDSTICK) and inv.exit_code == (5 if fails else 0)
    assert paired(inv) == inv  # judged once: a reloaded report judged again says the same
    back = load_invariance(inv.to_json())
    assert back.to_json() == inv.to_json() and back.variants[0].pairs == c.pairs


# -- the nightly diff


def _night(*variants: dict) -> dict:
    return {"schema": "strict-gate/report@2", "prompts": [], "summary": {}, "invariance": {"variants": list(variants)}}


def test_the_diff_holds_a_move_shared_with_the_reference_as_held():
    beside = {k.value: [] for k in Pairing}
    held = {"arm": "candidate", "name": "batch-4", "verdict": "pass", "prompts_exact": 8, "prompts_total": 8,
            "beside_reference": beside}
    shared = held | {"prompts_exact": 6, "beside_reference": beside | {Pairing.WITH_REFERENCE.value: ["a", "b"]}}
    own = held | {"prompts_exact": 6, "verdict": "fail",
                  "beside_reference": beside | {Pairing.CANDIDATE_ONLY.value: ["a", "b"]}}
    yardstick = {"arm": "reference", "name": "batch-4", "verdict": "yardstick", "prompts_exact": 6,
                 "prompts_total": 8}
    assert diff_reports(_night(held), _night(shared, yardstick)).regressions == ()
    d = diff_reports(_night(held), _night(own))
    assert [r.rule for r in d.regressions] == [Rule.VARIANT_MOVED]
    from strict_gate.nightly.variants_diff import markdown_lines

    assert "pass, 6/8 exact, 2 moves with the reference" in "\n".join(
        markdown_lines(diff_reports(_night(held), _night(shared)).variants))
