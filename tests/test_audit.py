"""The run audit (issue: distrust every engine): each way a run could talk the gate into a
pass, tried through the real CLI on stored runs and through a live command engine."""

import json
import sys
from pathlib import Path

import pytest
from helpers import confident, rec, step, write_gate, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.errors import ConfigError
from strict_gate.gate.config import parse_gate_config
from strict_gate.judge.compare import Status
from strict_gate.judge.compare_runs import compare_runs

runner = CliRunner()
HERE = Path(__file__).resolve().parent
SHA = "a" * 64


def compare(tmp_path, ref, cand, *args, ref_kw=None, cand_kw=None):
    write_run(tmp_path / "ref", ref, sha=SHA, **(ref_kw or {}))
    write_run(tmp_path / "cand", cand, sha=SHA, **(cand_kw or {}))
    out = tmp_path / "out"
    result = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--out", str(out), *args])
    assert "Traceback" not in result.output, result.output
    return result, out


def edit_jsonl(path: Path, fn) -> None:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    path.write_text("".join(json.dumps(fn(d)) + "\n" for d in lines))


def edit_manifest(run: Path, fn) -> None:
    m = json.loads((run / "manifest.json").read_text())
    fn(m)
    (run / "manifest.json").write_text(json.dumps(m))


# ---------------------------------------------------------------- greedy


def test_sampler_bug_8_nats_below_own_argmax_is_not_greedy_under_every_policy(tmp_path):
    # The candidate chose 40 although its own top-1 (12) is 8 nats better: a sampler bug.
    ref = [rec("p", [11, 12, 13])]
    cand = [rec("p", [11, 40, 13], tops=[confident(11), step((12, -0.01), (40, -8.01)), confident(13)])]
    for policy in ("near-tie", "strict", "auto"):
        result, out = compare(tmp_path / policy, ref, cand, "--policy", policy)
        assert result.exit_code == 1, result.output
        report = json.loads((out / "report.json").read_text())
        (p,) = report["prompts"]
        assert p["status"] == "not_greedy" and not p["passed"]
        assert "token 40 at position 1" in p["reason"] and "top-1 12" in p["reason"] and "8.0" in p["reason"]


def test_exact_tie_at_the_argmax_is_greedy(tmp_path):
    # Either token of an exact tie is a greedy choice; the two arms' different picks are a near-tie.
    # (max_tokens 2, "length": a "stop" on 40 would be a stop the gate cannot judge, issue 36)
    ref = [rec("p", [11, 12], tops=[confident(11), step((12, -0.7), (40, -0.7))], finish="length")]
    cand = [rec("p", [11, 40], tops=[confident(11), step((12, -0.7), (40, -0.7))], finish="length")]
    result, out = compare(tmp_path, ref, cand, "--policy", "near-tie", ref_kw={"max_tokens": 2},
                          cand_kw={"max_tokens": 2})
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["prompts"][0]["status"] == "near_tie"


def test_negative_gap_within_greedy_tolerance_is_never_a_near_tie():
    # 40 sits 0.0005 nats under the candidate's own top-1: greedy within tolerance, but its
    # candidate gap is negative, and a negative gap is no near-tie.
    ref = {"p": rec("p", [12], tops=[step((12, -0.5), (40, -0.6))])}
    cand = {"p": rec("p", [40], tops=[step((12, -0.5), (40, -0.5005))])}
    pc = compare_runs(ref, cand, band=0.5).prompts[0]
    assert pc.status == Status.DIVERGENT
    assert "candidate gap" in pc.first_divergence.reason and "< 0" in pc.first_divergence.reason


def test_greedy_tolerance_is_configurable_and_checked(tmp_path):
    cand = {"p": rec("p", [40], tops=[step((12, -0.5), (40, -0.52))])}
    ref = {"p": rec("p", [12], tops=[step((12, -0.5), (40, -0.6))])}
    assert compare_runs(ref, cand, greedy_tolerance=1e-3).prompts[0].status == Status.NOT_GREEDY
    assert compare_runs(ref, cand, greedy_tolerance=0.05).prompts[0].status == Status.DIVERGENT
    with pytest.raises(ConfigError) as e:
        parse_gate_config(GATE.replace("band = 0.5", "band = 0.5\ngreedy_tolerance = -1"), "g.toml")
    assert e.value.line == 7


# ---------------------------------------------------------------- logprobs and the format


@pytest.mark.parametrize(
    "mutate,rule",
    [
        (lambda d: d["top_logprobs"][0].__setitem__(0, [d["token_ids"][0], "-Infinity"]), "finite-logprobs"),
        (lambda d: d["top_logprobs"][0].__setitem__(0, [d["token_ids"][0], 0.25]), "finite-logprobs"),
        (lambda d: d["top_logprobs"].__setitem__(0, d["top_logprobs"][0][1:]), "chosen-listed"),
        (lambda d: d["top_logprobs"][0].__setitem__(1, [d["token_ids"][0], -3.0]), "unique-ids"),
        (lambda d: d["top_logprobs"][0].reverse(), "sorted"),
        (lambda d: d.__setitem__("token_ids", [-5] + d["token_ids"][1:]), "token-range"),
        (lambda d: d.__setitem__("prompt_token_ids", [2**40]), "token-range"),
        (lambda d: d.__setitem__("finish_reason", "length"), "finish-reason"),
        (lambda d: [(d["token_ids"].append(t), d["top_logprobs"].append([[t, -0.1]])) for t in (98, 99)], "finish-reason"),
        (lambda d: d.__setitem__("timing", {"ttft_s": 0.1, "total_s": "slow"}), "$.timing.total_s"),
    ],
)
def test_stored_run_breaking_a_rule_is_exit_2_naming_the_rule(tmp_path, mutate, rule):
    ref = [rec("p0", [5, 6]), rec("p1", [7, 8])]
    write_run(tmp_path / "ref", ref, sha=SHA, max_tokens=3)
    write_run(tmp_path / "cand", ref, sha=SHA, max_tokens=3)
    raw = (tmp_path / "cand" / "records.jsonl").read_text().splitlines()
    d = json.loads(raw[1])
    mutate(d)
    raw[1] = json.dumps(d).replace('"-Infinity"', "-Infinity")
    (tmp_path / "cand" / "records.jsonl").write_text("\n".join(raw) + "\n")
    result = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand")])
    assert result.exit_code == 2, result.output
    flat = result.output.replace("\n", "")
    assert "records.jsonl:2:" in flat and rule in flat and "Traceback" not in flat


def test_token_ids_beyond_a_known_vocabulary_are_refused(tmp_path):
    ref = [rec("p0", [5, 6])]
    bad = [rec("p0", [5, 5000], tops=[confident(5), confident(5000)])]  # tiny-llama has 1024 tokens
    write_run(tmp_path / "ref", ref, sha=SHA, model="bundled:tiny-llama")
    write_run(tmp_path / "cand", bad, sha=SHA, model="bundled:tiny-llama")
    result = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand")])
    assert result.exit_code == 2 and "token-range" in result.output and "1024" in result.output


def test_invalid_utf8_and_malformed_manifests_are_exit_2(tmp_path):
    write_run(tmp_path / "ref", [rec("p0", [5])], sha=SHA)
    write_run(tmp_path / "cand", [rec("p0", [5])], sha=SHA)
    cases = {
        "utf8": lambda: (tmp_path / "cand" / "records.jsonl").write_bytes(b'{"id": "\xff\xfe", "prompt_token_ids": [1]}\n'),
        "runs": lambda: edit_manifest(tmp_path / "cand", lambda m: m.__setitem__("runs", "five")),
        "temperature": lambda: edit_manifest(tmp_path / "cand", lambda m: m["sampling"].__setitem__("temperature", 1.0)),
        "no sha": lambda: edit_manifest(tmp_path / "cand", lambda m: m["prompt_set"].pop("sha256")),
    }
    for name, breaks in cases.items():
        write_run(tmp_path / "cand", [rec("p0", [5])], sha=SHA)
        breaks()
        result = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand")])
        assert result.exit_code == 2, (name, result.output)
        assert "Traceback" not in result.output
    assert "rule temperature" not in result.output  # the last case is the missing hash
    assert "rule prompt-set" in result.output.replace("\n", "")


# ---------------------------------------------------------------- comparability and completeness


@pytest.mark.parametrize(
    "cand_kw,field",
    [({"sha": "b" * 64}, "prompt set sha256"), ({"max_tokens": 8}, "max_tokens"), ({"top": 3}, "top_logprobs")],
)
def test_runs_that_differ_are_not_comparable_exit_2_naming_the_field(tmp_path, cand_kw, field):
    write_run(tmp_path / "ref", [rec("p0", [5])], sha=SHA)
    write_run(tmp_path / "cand", [rec("p0", [5])], **({"sha": SHA} | cand_kw))
    result = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand")])
    assert result.exit_code == 2 and f"not comparable: {field}" in result.output.replace("\n", " ")


def test_prompt_missing_from_both_runs_is_missing_not_absent(tmp_path):
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2]}) + "\n" for i in range(3)))
    from strict_gate.runs.prompts import load_prompts

    sha = load_prompts(prompts).sha256
    both = [rec("p0", [5]), rec("p1", [6])]  # p2 is in neither run
    write_run(tmp_path / "ref", both, sha=sha)
    write_run(tmp_path / "cand", both, sha=sha)
    result = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand"),
                                 "--prompts", str(prompts), "--out", str(tmp_path / "o")])
    assert result.exit_code == 3, result.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["verdict"] == "incomplete"
    assert [p["status"] for p in report["prompts"]] == ["match", "match", "missing"]
    # Without --prompts the ids come from the manifest, when the writer recorded them.
    for run in ("ref", "cand"):
        edit_manifest(tmp_path / run, lambda m: m["prompt_set"].__setitem__("ids", ["p0", "p1", "p2"]))
    assert runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand")]).exit_code == 3


def test_gate_that_compared_zero_positions_is_incomplete(tmp_path):
    empty = [rec("p0", [], tops=[]), rec("p1", [], tops=[])]
    result, out = compare(tmp_path, empty, empty)
    assert result.exit_code == 3, result.output
    assert "zero token positions" in json.loads((out / "report.json").read_text())["reasons"][0]


# ---------------------------------------------------------------- the band and option values

# Hand-written, not write_gate: the tests below check the line numbers of the errors in this text.
GATE = """name = "t"
prompts = "set.jsonl"
max_tokens = 4
top_logprobs = 5
policy = "near-tie"
band = 0.5
[reference]
kind = "recorded"
path = "ref"
[candidate]
kind = "hf"
model = "bundled:tiny-llama"
dtype = "bfloat16"
"""


@pytest.mark.parametrize(
    "old,new,line,msg",
    [
        ("band = 0.5", "band = nan", 6, "finite"),
        ("band = 0.5", "band = inf", 6, "finite"),
        ("band = 0.5", "band = -1.0", 6, ">= 0"),
        ('dtype = "bfloat16"', 'dtype = "fp32"', 13, "expected one of 'float32'"),
        ('dtype = "bfloat16"', 'dtype = "bfloat16"\ndevice = "gpu0"', 14, "not a valid value"),
        ('dtype = "bfloat16"', 'dtype = "bfloat16"\nbatch = 0', 14, "must be >= 1"),
        ('kind = "hf"\nmodel = "bundled:tiny-llama"\ndtype = "bfloat16"',
         'kind = "command"\ncommand = ["x"]\ntimeout_s = 0', 13, "must be > 0"),
        ('kind = "hf"\nmodel = "bundled:tiny-llama"\ndtype = "bfloat16"',
         'kind = "command"\ncommand = ["x"]\nstartup_timeout_s = inf', 13, "finite"),
    ],
)
def test_band_and_option_values_are_checked_where_read(tmp_path, old, new, line, msg):
    text = GATE.replace(old, new, 1)
    (tmp_path / "gate.toml").write_text(text)
    with pytest.raises(ConfigError) as e:
        parse_gate_config(text, str(tmp_path / "gate.toml"))
    assert msg in str(e.value) and e.value.line == line, str(e.value)
    result = runner.invoke(app, ["gate", str(tmp_path / "gate.toml")])
    assert result.exit_code == 2 and f"gate.toml:{line}:" in result.output.replace("\n", "")


@pytest.mark.parametrize("band", ["nan", "inf", "-1"])
def test_cli_band_must_be_finite_and_non_negative(tmp_path, band):
    result, _ = compare(tmp_path, [rec("p", [5])], [rec("p", [5])], "--band", band)
    assert result.exit_code == 2 and "band must be a finite number >= 0" in result.output


def test_gap_exactly_at_the_band_is_within_and_messages_do_not_contradict_themselves():
    # -0.1 - -0.6 is 0.5 up to float representation: within the band.
    ref = {"p": rec("p", [12], tops=[step((12, -0.1), (40, -0.6))])}
    cand = {"p": rec("p", [40], tops=[step((40, -0.1), (12, -0.6))])}
    assert compare_runs(ref, cand, band=0.5).prompts[0].status == Status.NEAR_TIE
    ref = {"p": rec("p", [12], tops=[step((12, -0.1), (40, -0.60004))])}
    cand = {"p": rec("p", [40], tops=[step((40, -0.1), (12, -0.6))])}
    pc = compare_runs(ref, cand, band=0.5).prompts[0]
    assert pc.status == Status.DIVERGENT
    assert "reference gap 0.50004 > band 0.5" in pc.first_divergence.reason


# ---------------------------------------------------------------- live engines


def _live_gate(tmp_path, canned: list[dict], max_tokens=2) -> tuple[int, str, Path]:
    (tmp_path / "set.jsonl").write_text('{"id": "a", "token_ids": [1, 2]}\n{"id": "b", "token_ids": [3, 4]}\n')
    (tmp_path / "canned.jsonl").write_text("".join(json.dumps(c) + "\n" for c in canned))
    fake = HERE / "engines" / "fake_engine.py"
    gate = write_gate(tmp_path, name="live", prompts="set.jsonl", max_tokens=max_tokens, top_logprobs=2,
                      policy="near-tie", output_dir=tmp_path / "reports", diagnose=False,
                      reference={"kind": "command", "command": [sys.executable, fake]},
                      candidate={"kind": "command", "command": [sys.executable, fake, "--canned", tmp_path / "canned.jsonl"]})
    result = runner.invoke(app, ["gate", str(gate)])
    assert "Traceback" not in result.output
    (report,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    return result.exit_code, result.output, report


def test_live_engine_breaking_the_format_is_an_engine_failure_exit_3(tmp_path):
    # NaN logprobs (json.loads accepts the literal; the audit does not).
    canned = [{"prompt_token_ids": [1, 2], "token_ids": [3, 4], "finish_reason": "length",
               "top_logprobs": [[[3, float("nan")], [9, -1.0]], [[4, -0.1], [9, -1.0]]]}]
    code, output, report = _live_gate(tmp_path, canned)
    assert code == 3, output
    manifest = json.loads((report / "candidate" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "finite-logprobs" in manifest["error"]


def test_live_sampler_bug_fails_the_gate_as_not_greedy(tmp_path):
    # The fake engine's echo answer for prompt [1, 2] is tokens 3, 4; this one picks 9 at step 0
    # while listing 3 as 6 nats better.
    canned = [{"prompt_token_ids": [1, 2], "token_ids": [9, 4], "finish_reason": "length",
               "top_logprobs": [[[3, -0.1], [9, -6.1]], [[4, -0.2], [1004, -5.0]]]}]
    code, output, report = _live_gate(tmp_path, canned)
    assert code == 1, output
    statuses = {p["id"]: p["status"] for p in json.loads((report / "report.json").read_text())["prompts"]}
    assert statuses == {"a": "not_greedy", "b": "match"}
