"""[invariance]: the config's rules (exit 2 with file and line before anything starts), the
verdict over stored runs, its exit code beside the token verdict's, the reports and the diff.

The engines here are real command engines (tests/engines/variant_engine.py); the hostile ones
are in test_adversarial_invariance.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from helpers import rec, step, write_gate, write_run
from hypothesis import given, settings
from hypothesis import strategies as st

from strict_gate.errors import ConfigError, ExitCode
from strict_gate.gate.config import load_gate_config
from strict_gate.invariance.config import InvariancePolicy
from strict_gate.invariance.render import write_invariance_reports
from strict_gate.invariance.verdict import InvarianceResult, VariantVerdict, judge_variant
from strict_gate.judge.result import overall_exit_code
from strict_gate.nightly.diff import Rule, diff_reports
from strict_gate.runs.reader import load_run

HERE = Path(__file__).resolve().parent
ENGINE = str(HERE / "engines" / "variant_engine.py")
CMD = {"kind": "command", "command": ["python", ENGINE]}
HF = {"kind": "hf", "model": "bundled:tiny-llama"}


def _prompts(tmp_path: Path, n: int = 6) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [5 + i, 9, 40 + 3 * i, 7]}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return str(path)


def _config_error(tmp_path: Path, invariance: dict, candidate: dict | None = None) -> ConfigError:
    path = write_gate(tmp_path, prompts=_prompts(tmp_path), reference=CMD, candidate=candidate or CMD,
                      invariance=invariance)
    with pytest.raises(ConfigError) as e:
        load_gate_config(path)
    return e.value


def _line(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(key))


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"batch": [0, 8]}, "batch", "distinct integers >= 1"),
    ({"batch": [8, 8]}, "batch", "distinct integers >= 1"),
    ({"concurrency": [8], "batchh": [2]}, "batchh", "did you mean 'batch'"),
    ({"chunked_prefill": [-1]}, "chunked_prefill", ">= 0"),
    ({"batch": [8], "repeats": 0}, "repeats", ">= 1"),
    ({"batch": [8], "policy": "strikt"}, "policy", "did you mean 'strict'"),
    ({"batch": [8], "arms": ["rescorer"]}, "arms", "each one of candidate, reference"),
    ({"batch": [8], "arms": []}, "arms", "non-empty"),
])
def test_a_bad_value_is_refused_at_its_line(tmp_path, table, key, words):
    e = _config_error(tmp_path, table)
    assert words in str(e) and e.line == _line(tmp_path / "gate.toml", key), str(e)


def test_a_table_without_variants_is_refused(tmp_path):
    e = _config_error(tmp_path, {"repeats": 3})
    assert "names no variant" in str(e) and e.line == _line(tmp_path / "gate.toml", "[invariance]")


def test_a_variant_the_arm_cannot_serve_is_refused_before_anything_starts(tmp_path):
    e = _config_error(tmp_path, {"batch": [8], "concurrency": [4]}, candidate=HF)
    assert "concurrency cannot run on the [candidate] arm: a 'hf' engine" in str(e)
    assert "its variants: batch, chunked_prefill, needle" in str(e)
    assert e.line == _line(tmp_path / "gate.toml", "concurrency")


def test_a_stored_run_has_no_variants(tmp_path):
    path = write_gate(tmp_path, prompts=_prompts(tmp_path), reference={"kind": "recorded", "path": "nowhere"},
                      candidate=CMD, invariance={"batch": [8], "arms": ["reference"]})
    with pytest.raises(ConfigError, match="is a stored run") as e:
        load_gate_config(path)
    assert e.value.line == _line(path, "arms")


def test_a_chunk_beyond_the_context_is_refused(tmp_path):
    """The bundled model's context is 512 tokens (its config.json); vLLM's max_model_len wins."""
    pytest.importorskip("vllm")
    vllm = {"kind": "vllm", "model": "bundled:tiny-llama", "max_model_len": 256}
    e = _config_error(tmp_path, {"chunked_prefill": [64, 300]}, candidate=vllm)
    assert "chunked_prefill 300 is beyond the [candidate] arm's context of 256 tokens" in str(e)
    assert e.line == _line(tmp_path / "gate.toml", "chunked_prefill")


def test_the_cli_says_file_and_line_and_exits_2(tmp_path):
    path = write_gate(tmp_path, prompts=_prompts(tmp_path), reference=CMD, candidate=CMD,
                      invariance={"batch": [0]})
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "invariance", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == ExitCode.BAD_INPUT
    assert f"{path}:{_line(path, 'batch')}:" in p.stderr and "Traceback" not in p.stderr


def test_a_gate_without_the_table_is_refused_by_the_command(tmp_path):
    path = write_gate(tmp_path, prompts=_prompts(tmp_path), reference=CMD, candidate=CMD)
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "invariance", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "has no [invariance] table" in p.stderr


# -- the verdict, over stored runs


def _runs(tmp_path: Path, base: dict, variant: dict, name: str = "v") -> tuple:
    def records(seqs: dict):  # id -> (tokens, gaps, runner-ups (default: token + 1))
        out = []
        for pid, (toks, gaps, *more) in seqs.items():
            runners = more[0] if more else [t + 1 for t in toks]
            out.append(rec(pid, toks, tops=[step((t, -0.01), (r, -0.01 - g), (max(t, r) + 500, -6.0))
                                            for t, g, r in zip(toks, gaps, runners)]))
        return out
    b = load_run(write_run(tmp_path / f"{name}-base", records(base)))
    v = load_run(write_run(tmp_path / f"{name}-run", records(variant)))
    return b, v


SAME = {"p0": ([1, 2, 3, 4], [3, 3, 3, 3]), "p1": ([5, 6, 7, 8], [3, 3, 3, 3])}


def test_an_identical_variant_passes(tmp_path):
    b, v = _runs(tmp_path, SAME, SAME)
    r = judge_variant("batch-8", "candidate", b, [v], policy=InvariancePolicy.STRICT, band=0.5)
    assert (r.verdict, r.prompts_exact, r.prompts_total, r.distinct_outputs, r.divergences) == \
        (VariantVerdict.PASS, 2, 2, 1, ())
    assert r.positions_matched == r.positions_total == 8


def test_a_flip_is_classified_from_both_runs_margins(tmp_path):
    """A flip at a 0.1-nat gap is a batch-variant near-tie; at 3 nats a batch dependence."""
    tie = {"p0": ([1, 2, 9, 4], [3, 3, 0.1, 3]), "p1": ([5, 6, 7, 8], [3, 3, 3, 3])}
    base_tie = {"p0": ([1, 2, 3, 4], [3, 3, 0.1, 3]), "p1": SAME["p1"]}
    flipped = {"p0": ([1, 2, 4, 4], [3, 3, 0.1, 3], [2, 3, 3, 5]), "p1": SAME["p1"]}
    b, v = _runs(tmp_path, base_tie, flipped, "tie")
    strict = judge_variant("batch-8", "candidate", b, [v], policy=InvariancePolicy.STRICT, band=0.5)
    near = judge_variant("batch-8", "candidate", b, [v], policy=InvariancePolicy.NEAR_TIE, band=0.5)
    assert strict.verdict == VariantVerdict.FAIL and near.verdict == VariantVerdict.INCOMPLETE  # position 3 unjudged
    assert "p0: a near-tie at position 2; position 3 after the flip not judged" in near.problems[0]
    (m,) = strict.divergences
    assert (m.id, m.position, m.label, m.baseline_token, m.variant_token) == \
        ("p0", 2, "batch-variant near-tie", 3, 4)
    b, v = _runs(tmp_path, SAME, tie, "far")
    far = judge_variant("batch-8", "candidate", b, [v], policy=InvariancePolicy.NEAR_TIE, band=0.5)
    assert far.verdict == VariantVerdict.FAIL and far.divergences[0].label == "batch dependence"


def test_a_missing_prompt_is_incomplete_never_a_pass(tmp_path):
    b, v = _runs(tmp_path, SAME, {"p0": SAME["p0"]})
    r = judge_variant("batch-8", "candidate", b, [v], policy=InvariancePolicy.NEAR_TIE, band=0.5)
    assert r.verdict == VariantVerdict.INCOMPLETE


def test_repeats_count_distinct_outputs(tmp_path):
    b, v1 = _runs(tmp_path, SAME, SAME, "r1")
    _, v2 = _runs(tmp_path, SAME, {"p0": ([1, 2, 3, 9], [3, 3, 3, 3]), "p1": SAME["p1"]}, "r2")
    r = judge_variant("batch-1", "candidate", b, [v1, v2], policy=InvariancePolicy.STRICT, band=0.5)
    assert (r.distinct_outputs, r.prompts_distinct, r.prompts_exact) == (2, 1, 1)
    assert r.divergences[0].run == 2 and r.positions_matched == 7


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=4), min_size=1, max_size=6),
       st.sets(st.integers(0, 5)))
def test_prompts_exact_counts_exactly_the_unmoved(tmp_path_factory, seqs, moved):
    tmp = tmp_path_factory.mktemp("h")
    base = {f"p{i}": (s, [3.0] * len(s)) for i, s in enumerate(seqs)}
    var = {pid: ([t + 100 if i == 0 and int(pid[1:]) in moved else t for i, t in enumerate(s)], g)
           for pid, (s, g) in base.items()}
    b, v = _runs(tmp, base, var)
    r = judge_variant("batch-8", "candidate", b, [v], policy=InvariancePolicy.STRICT, band=0.5)
    n_moved = sum(1 for i in range(len(seqs)) if i in moved)
    assert r.prompts_exact == len(seqs) - n_moved == r.prompts_total - len(r.divergences)
    assert (r.verdict == VariantVerdict.PASS) == (n_moved == 0)
    assert r.distinct_outputs == (2 if n_moved else 1)


def _result(tmp_path: Path, policy: InvariancePolicy, moved: bool) -> InvarianceResult:
    variant = {"p0": ([1, 2, 9, 4], [3, 3, 3, 3]), "p1": SAME["p1"]} if moved else SAME
    b, v = _runs(tmp_path, SAME, variant, f"{policy}-{moved}")
    r = judge_variant("batch-8", "candidate", b, [v], policy=policy, band=0.5)
    return InvarianceResult(policy, 0.5, {}, (r,), {"candidate": b.path})


@pytest.mark.parametrize(("policy", "moved", "code"), [
    (InvariancePolicy.STRICT, False, 0), (InvariancePolicy.STRICT, True, 5),
    (InvariancePolicy.NEAR_TIE, True, 5), (InvariancePolicy.INFORMATIONAL, True, 0),
])
def test_the_exit_code_and_the_token_verdict_first(tmp_path, policy, moved, code):
    inv = _result(tmp_path, policy, moved)
    assert inv.exit_code == code
    assert overall_exit_code(0, (inv,)) == code
    assert overall_exit_code(1, (inv,)) == 1 and overall_exit_code(3, (inv,)) == 3


def test_a_variant_that_did_not_run_exits_3_under_a_real_policy(tmp_path):
    from strict_gate.invariance.verdict import not_run

    inv = InvarianceResult(InvariancePolicy.STRICT, 0.5, {}, (not_run("batch-8", "candidate", "no start"),), {})
    assert inv.exit_code == ExitCode.ENGINE_FAILURE and inv.verdict == VariantVerdict.INCOMPLETE
    empty = InvarianceResult(InvariancePolicy.STRICT, 0.5, {}, (), {})
    assert empty.exit_code == 3  # no variant judged is never a pass


def test_the_invariance_files(tmp_path):
    inv = _result(tmp_path, InvariancePolicy.STRICT, True)
    out = tmp_path / "out"
    out.mkdir()
    written = write_invariance_reports(inv, out, name="g")
    doc = json.loads(written["json"].read_text())
    (v,) = doc["invariance"]["variants"]
    assert {"name", "arm", "prompts_exact", "positions_matched", "distinct_outputs", "divergences", "verdict"} <= set(v)
    assert (v["name"], v["verdict"], v["prompts_exact"], v["divergences"][0]["id"]) == ("batch-8", "fail", 1, "p0")
    assert "| batch-8 | candidate | fail | 1/2 |" in written["md"].read_text()
    assert "<span class='strip'>" in written["html"].read_text()
    case = ET.parse(written["junit"]).getroot().find("testcase")
    assert case.get("name") == "invariance candidate batch-8" and case.find("failure") is not None


def _night(variants: list[dict]) -> dict:
    return {"schema": "strict-gate/report@2", "prompts": [], "summary": {}, "invariance": {"variants": variants}}


def test_diff_reports_a_variant_that_started_to_move():
    held = {"arm": "candidate", "name": "batch-8", "verdict": "pass", "prompts_exact": 8, "prompts_total": 8}
    moved = held | {"verdict": "fail", "prompts_exact": 7}
    d = diff_reports(_night([held]), _night([moved]))
    assert [r.rule for r in d.regressions] == [Rule.VARIANT_MOVED] and "candidate batch-8" in d.regressions[0].detail
    assert d.exit_code == 0  # reported; it fails the job with --fail-on variant-moved
    assert diff_reports(_night([held]), _night([moved]), fail_on=(Rule.VARIANT_MOVED,)).exit_code == 1
    assert diff_reports(_night([moved]), _night([held])).regressions == ()  # it stopped moving: no regression
    assert diff_reports(_night([]), _night([moved])).regressions == ()  # new tonight: listed, not a regression


def test_diff_treats_a_speculative_variant_like_the_others_and_shows_its_acceptance():
    held = {"arm": "candidate", "name": "speculative-ngram-3", "verdict": "pass", "prompts_exact": 8,
            "prompts_total": 8, "exact": True, "acceptance": {"acceptance_rate": 0.25, "drafted": 40}}
    moved = held | {"verdict": "fail", "prompts_exact": 6, "acceptance": {"acceptance_rate": 0.5}}
    d = diff_reports(_night([held]), _night([moved]))
    assert [r.rule for r in d.regressions] == [Rule.VARIANT_MOVED]
    assert "candidate speculative-ngram-3" in d.regressions[0].detail
    (change,) = d.variants
    assert change.old["acceptance_rate"] == 0.25 and change.new["acceptance_rate"] == 0.5
    from strict_gate.nightly.variants_diff import markdown_lines

    assert "| candidate speculative-ngram-3 | pass, 8/8 exact, acceptance 25.0% | fail, 6/8 exact, acceptance 50.0% |" \
        in "\n".join(markdown_lines(d.variants))
    cheaper = held | {"acceptance": {"acceptance_rate": 0.1}}  # it stopped paying: listed, not a regression
    d = diff_reports(_night([held]), _night([cheaper]))
    assert d.regressions == () and len(d.variants) == 1
