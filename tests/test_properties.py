"""Property-based tests (hypothesis) of the reader, the audit, the comparator and the policies
over generated runs: invariants that must hold for every run, not just the hand-picked ones."""

import json
import math
import random
from pathlib import Path

import pytest
from helpers import write_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strict_gate.errors import StrictGateError
from strict_gate.judge.compare import BAND_EPS, Status
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.policy import apply_policy
from strict_gate.runs import reader
from strict_gate.runs.audit import greedy_violation
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Record, sort_topk

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DISK = settings(SETTINGS, max_examples=40)  # examples that write run directories
MAX_TOKENS = 5


@st.composite
def steps(draw, length: int):
    """`length` honest greedy steps: distinct ids, sorted, finite logprobs <= 0 (ties allowed)."""
    out = []
    for _ in range(length):
        w = draw(st.integers(2, 4))
        ids = draw(st.lists(st.integers(0, 9), min_size=w, max_size=w, unique=True))
        lps = draw(st.lists(st.sampled_from([0.0, -0.25, -0.5, -0.5000001, -0.7, -1.0, -3.0, -9.0]) | st.floats(-12, 0),
                            min_size=w, max_size=w))
        out.append(sort_topk(zip(ids, lps)))
    return tuple(out)


@st.composite
def honest_record(draw, pid: str):
    n = draw(st.integers(1, MAX_TOKENS))
    tops = draw(steps(n))
    tokens = tuple(step[0][0] for step in tops)
    return Record(pid, (1, 2), tokens, "length" if n == MAX_TOKENS else "stop", tops)


@st.composite
def run_pair(draw):
    """A reference and a candidate that agree, diverge, or cheat, prompt by prompt."""
    ids = [f"p{i}" for i in range(draw(st.integers(1, 5)))]
    ref, cand = {}, {}
    for pid in ids:
        r = draw(honest_record(pid))
        ref[pid] = r
        how = draw(st.sampled_from(["same", "same", "regen", "cheat"]))
        if how == "same":
            cand[pid] = r
        elif how == "regen":  # same prefix, then its own honest steps from position d on
            d = draw(st.integers(0, len(r.token_ids) - 1))
            tail = draw(steps(len(r.token_ids) - d))
            tops = tuple(r.top_logprobs[:d]) + tail
            cand[pid] = Record(pid, (1, 2), tuple(s[0][0] for s in tops), r.finish_reason, tops)
        else:  # a token that is not the candidate's own argmax
            i = draw(st.integers(0, len(r.token_ids) - 1))
            step = r.top_logprobs[i]
            j = draw(st.integers(1, len(step) - 1))
            tokens = list(r.token_ids)
            tokens[i] = step[j][0]
            cand[pid] = Record(pid, (1, 2), tuple(tokens), r.finish_reason, r.top_logprobs)
    return ref, cand


def _lp(step, token):
    return next((lp for t, lp in step if t == token), None)


@SETTINGS
@given(run_pair(), st.sampled_from(["strict", "near-tie", "auto"]), st.sampled_from([0.0, 0.1, 0.5, 2.0]))
def test_a_pass_implies_equal_tokens_or_two_small_non_negative_gaps(pair, policy, band):
    ref, cand = pair
    comparison = compare_runs(ref, cand, band=band)
    verdict = apply_policy(comparison, policy, ref, cand)
    if verdict.verdict != "pass":
        return
    for pid, r in ref.items():
        c = cand[pid]
        assert greedy_violation(c, 1e-3) is None and greedy_violation(r, 1e-3) is None
        if r.token_ids == c.token_ids:
            continue
        assert policy == "near-tie"
        d = next(i for i, (a, b) in enumerate(zip(r.token_ids, c.token_ids)) if a != b)
        rt, ct = r.token_ids[d], c.token_ids[d]
        ref_gap = _lp(r.top_logprobs[d], rt) - _lp(r.top_logprobs[d], ct)
        cand_gap = _lp(c.top_logprobs[d], ct) - _lp(c.top_logprobs[d], rt)
        for gap in (ref_gap, cand_gap):
            assert math.isfinite(gap) and 0 <= gap <= band + BAND_EPS


@SETTINGS
@given(st.data())
def test_changing_any_token_of_a_passing_strict_run_makes_it_fail(data):
    ref = {f"p{i}": data.draw(honest_record(f"p{i}")) for i in range(data.draw(st.integers(1, 4)))}
    assert apply_policy(compare_runs(ref, ref), "strict", ref, ref).verdict == "pass"
    pid = data.draw(st.sampled_from(sorted(ref)))
    r = ref[pid]
    i = data.draw(st.integers(0, len(r.token_ids) - 1))
    new = data.draw(st.integers(0, 12).filter(lambda t: t != r.token_ids[i]))
    tokens = r.token_ids[:i] + (new,) + r.token_ids[i + 1 :]
    # Rebuild that step so the changed run is still honest where it can be (new token on top).
    tops = list(r.top_logprobs)
    others = [(t, lp) for t, lp in tops[i] if t != new][: len(tops[i]) - 1]
    tops[i] = sort_topk([(new, 0.0)] + [(t, min(lp, -1.0)) for t, lp in others])
    cand = dict(ref) | {pid: Record(pid, r.prompt_token_ids, tokens, r.finish_reason, tuple(tops))}
    for policy in ("strict", "auto"):
        assert apply_policy(compare_runs(ref, cand), policy, ref, cand).verdict != "pass"


@SETTINGS
@given(run_pair(), st.randoms(use_true_random=False), st.sampled_from(["strict", "near-tie"]))
def test_the_verdict_does_not_depend_on_record_order(pair, rnd: random.Random, policy):
    ref, cand = pair
    ids = sorted(ref)
    a = apply_policy(compare_runs(ref, cand, prompt_ids=ids), policy, ref, cand)
    shuffled = list(cand.items())
    rnd.shuffle(shuffled)
    cand2 = dict(shuffled)
    ref_items = list(ref.items())
    rnd.shuffle(ref_items)
    ref2 = dict(ref_items)
    b = apply_policy(compare_runs(ref2, cand2), policy, ref2, cand2)
    assert a.verdict == b.verdict
    assert sorted((v.id, v.passed) for v in a.prompts) == sorted((v.id, v.passed) for v in b.prompts)


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@DISK
@given(run_pair(), st.text(min_size=1, max_size=12))
def test_report_json_is_always_strict_json(tmp_path_factory, pair, weird):
    from strict_gate.gate.judgement import judge
    from strict_gate.judge.spec import GateSpec, PromptSetRef
    from strict_gate.report import write_reports
    from strict_gate.runs.records import EngineInfo, Manifest, Run, Sampling, Timing

    ref, cand = pair
    # Weird ids (control characters, quotes, non-ASCII) and timings that are not finite.
    rename = {pid: f"{pid}{weird}" for pid in ref}
    ref = {rename[k]: Record(rename[k], v.prompt_token_ids, v.token_ids, v.finish_reason, v.top_logprobs,
                             timing=Timing(float("nan"), float("inf"))) for k, v in ref.items()}
    cand = {rename[k]: Record(rename[k], v.prompt_token_ids, v.token_ids, v.finish_reason, v.top_logprobs)
            for k, v in cand.items()}
    sampling = Sampling(MAX_TOKENS, 5)
    ps = {"name": "p", "sha256": "0" * 64, "count": len(ref)}
    manifest = Manifest(EngineInfo("hand", env={"X": weird}), ps, sampling, "now", status="complete")
    d = tmp_path_factory.mktemp("r")
    spec = GateSpec("prop", PromptSetRef.stored(ps, None), sampling, policy="near-tie", band=0.5)
    result = judge(spec, Run(str(d / "ref"), manifest, ref), Run(str(d / "cand"), manifest, cand))
    write_reports(result, d / "out")
    report = _strict_json((d / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["verdict"] in ("pass", "fail", "incomplete")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@DISK
@given(st.sampled_from(["id", "prompt_token_ids", "token_ids", "finish_reason", "top_logprobs", "samples", "timing",
                        "error"]), JSON_VALUES, st.booleans())
def test_every_bad_record_is_bad_input_never_a_crash(tmp_path_factory, key, value, fast):
    d = tmp_path_factory.mktemp("bad")
    good = Record("p0", (1, 2), (3, 4), "stop", (((3, -0.1), (5, -2.0)), ((4, -0.2), (6, -3.0))))
    write_run(d, [good], max_tokens=MAX_TOKENS)
    obj = json.loads((d / "records.jsonl").read_text())
    obj[key] = value
    (d / "records.jsonl").write_text(json.dumps(obj) + "\n")
    old = reader.FAST_PATH_BYTES
    reader.FAST_PATH_BYTES = 0 if fast else old
    try:
        run = load_run(d)
    except StrictGateError as e:
        assert e.exit_code == 2 and str(d) in str(e)
        return
    finally:
        reader.FAST_PATH_BYTES = old
    rec = run.records[obj["id"]]  # accepted: then it must honour every claim
    assert len(rec.token_ids) <= MAX_TOKENS


@DISK
@given(run_pair())
def test_fast_and_precise_readers_agree(tmp_path_factory, pair):
    ref, _ = pair
    d = tmp_path_factory.mktemp("fp")
    write_run(d, list(ref.values()), max_tokens=MAX_TOKENS)
    precise = load_run(d).records
    old = reader.FAST_PATH_BYTES
    reader.FAST_PATH_BYTES = 0
    try:
        fast = load_run(d).records
    finally:
        reader.FAST_PATH_BYTES = old
    assert fast.keys() == precise.keys() == ref.keys()
    for pid, r in ref.items():
        for got in (fast[pid], precise[pid]):
            assert got.token_ids == r.token_ids and got.finish_reason == r.finish_reason
            assert [list(s) for s in got.top_logprobs] == [list(s) for s in r.top_logprobs]


def test_the_fast_path_is_taken_for_large_files(tmp_path, monkeypatch):
    calls = []
    real = reader._fast
    monkeypatch.setattr(reader, "_fast", lambda p: calls.append(p) or real(p))
    monkeypatch.setattr(reader, "FAST_PATH_BYTES", 1)
    write_run(tmp_path, [Record("p0", (1,), (3,), "stop", (((3, -0.1), (5, -2.0)),))], max_tokens=MAX_TOKENS)
    assert load_run(tmp_path).records["p0"].token_ids == (3,)
    assert calls == [Path(tmp_path) / "records.jsonl"]


@pytest.mark.parametrize("status", list(Status))
def test_every_status_but_match_and_near_tie_fails_every_policy(status):
    from strict_gate.judge.compare import Comparison, Divergence, PromptComparison, summarize
    from strict_gate.judge.policies import POLICIES

    div = Divergence(0, 3, 4, 0.1, 0.1, 0.1, "why")
    pc = PromptComparison("p", status, None if status == Status.MATCH else div, 0, 0, 1, 1, "detail")
    comp = Comparison(0.5, (pc,), summarize([pc]))
    rec = Record("p", (1,), (3,), "stop", None, samples=((3,), (3,)))
    for policy in POLICIES:
        if policy == "distributional" and status in (Status.MATCH, Status.NEAR_TIE, Status.DIVERGENT,
                                                      Status.LENGTH_MISMATCH):
            continue  # judged by the samples, not the status
        passed = apply_policy(comp, policy, {"p": rec}, {"p": rec}).prompts[0].passed
        assert passed == (status == Status.MATCH or (status == Status.NEAR_TIE and policy == "near-tie")), policy
