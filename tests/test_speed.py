"""The speed arm without a model: [speed] parsing, the method on engines with a known speed,
the matched-config check, the exit-code rule, the recorded-arm rule.

The fake engines pause 0.2 s before their first token and 0.1 s (or 0.05 s) per later token:
TTFT and decode are asserted within +-30 % here, the one place figures are asserted, because
the method itself is under test (tests/engines/speed_engine.py, tests/engines/fake_openai_server.py).
Every test that asserts a figure or a verdict of the command engines runs them in virtual time
(the `virtual_clock` fixture, tests/virtual_clock.py: their pauses are the time the measurement
reads), so that it holds on a loaded machine as on an idle one (issue 50, item 9).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import confident, rec, step, toml_text, write_gate
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.errors import ConfigError
from strict_gate.gate.config import load_gate_config
from strict_gate.speed.bench import run_bench
from strict_gate.speed.config import TokenRules
from strict_gate.speed.ladder import Request
from strict_gate.speed.matched import check_matched
from strict_gate.speed.measure import ArmMeasurement, ArmRung
from strict_gate.speed.model import (
    ArmFigures,
    Figure,
    FigureName,
    Method,
    Ratio,
    Rung,
    RungResult,
    SpeedVerdictKind,
    TokenCheck,
)
from strict_gate.speed.timed_tokens import check_tokens
from strict_gate.speed.verdict import judge_speed

ROOT = Path(__file__).resolve().parents[1]
ENGINE = Path(__file__).parent / "engines" / "speed_engine.py"
TTFT, PER_TOKEN = 0.2, 0.05
runner = CliRunner()


def command_arm(*flags: str, clock: Path | None = None) -> dict[str, Any]:
    """speed_engine.py as an arm; with `clock`, in virtual time (the virtual_clock fixture's file)."""
    return {"kind": "command", "command": ["python", str(ENGINE), *flags, *(("--clock", str(clock)) if clock else ())],
            "tokenizer": "bundled:tiny-llama"}


def gate_file(tmp_path: Path, reference: dict, candidate: dict, speed: dict | None, **top: Any) -> Path:
    prompts = tmp_path / "two.jsonl"  # the gate rung: two prompts keep the timing tests short
    prompts.write_text("\n".join((ROOT / "prompts" / "smoke.jsonl").read_text().splitlines()[:2]) + "\n")
    tables = {"speed": speed} if speed is not None else {}
    return write_gate(tmp_path, name="speed-test", prompts=prompts, max_tokens=4, output_dir=tmp_path / "out", **top,
                      reference=reference, candidate=candidate, **tables)


def within(got: float, want: float, tol: float = 0.3) -> bool:
    return abs(got - want) <= tol * want


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize("speed, words", [
    ("runz = 3", "unknown key 'runz'"),
    ('rungs = ["128x128"]', "is not"),
    ('rungs = ["0/8"]', ">= 1"),
    ("min_speed_ratio = 0", "> 0"),
    ("min_speed_ratio = { decode = -1.0 }", "> 0"),
    ("min_speed_ratio = { decod = 0.9 }", "unknown figure"),
    ("concurrency = [0]", "concurrency"),
    ("runs = 0", "runs"),
])
def test_bad_speed_config_is_exit_2_with_file_and_line(tmp_path, speed, words):
    path = gate_file(tmp_path, command_arm(), command_arm(), None)
    path.write_text(path.read_text() + f"[speed]\nwarmup = 0\n{speed}\n")  # the exact line the error must name
    with pytest.raises(ConfigError) as e:
        load_gate_config(path)
    assert words in str(e.value) and f"{path}:" in str(e.value)
    line = int(str(e.value).split(f"{path}:")[1].split(":")[0])
    assert path.read_text().splitlines()[line - 1].strip() == speed
    result = runner.invoke(app, ["bench", str(path)])
    assert result.exit_code == 2, result.output


def test_a_bare_number_is_the_decode_bar_and_defaults_hold(tmp_path):
    from strict_gate.speed.config import of

    speed = of(load_gate_config(gate_file(tmp_path, command_arm(), command_arm(), {"min_speed_ratio": 0.9})))
    assert speed is not None and speed.min_speed_ratio == {"decode": 0.9}
    assert (speed.warmup, speed.runs, speed.concurrency) == (1, 5, (1,))
    assert [r.name for r in speed.rungs] == ["128/128", "1024/128", "4096/128", "gate"]


def test_a_recorded_arm_is_refused(tmp_path):
    recorded = {"kind": "recorded", "path": ROOT / "baselines" / "tiny-llama-vllm-fp32", "model": "bundled:tiny-llama"}
    with pytest.raises(ConfigError, match="live engine"):
        load_gate_config(gate_file(tmp_path, command_arm(), recorded, {"runs": 1}))
    path = gate_file(tmp_path, recorded, command_arm(), {"runs": 1})
    with pytest.raises(ConfigError, match=r"\[rescorer\]"):
        load_gate_config(path)
    assert runner.invoke(app, ["bench", str(path)]).exit_code == 2
    # a live [rescorer] of the same model stands in as the speed reference
    path = gate_file(tmp_path, recorded, command_arm(), {"runs": 1}, rescorer={"kind": "hf", "model": "bundled:tiny-llama"})
    cfg = load_gate_config(path)
    assert cfg.speed_reference.kind == "hf"


# ---------------------------------------------------------------------------- the method


@pytest.mark.parametrize("stream", [False, True])
def test_command_engine_is_measured_within_tolerance(tmp_path, stream, virtual_clock):
    flags = ("--stream",) if stream else ()
    # the reference decodes at 10 tok/s, the candidate at 20
    path = gate_file(tmp_path, command_arm(*flags, "--per-token", str(2 * PER_TOKEN), clock=virtual_clock),
                     command_arm(*flags, clock=virtual_clock),
                     # two-request holds e2e to the decode bar too: 1.67x on 16/9, 1.43x on the gate rung
                     {"warmup": 0, "runs": 2, "rungs": ["16/9", "gate"], "concurrency": [1, 2],
                      "min_speed_ratio": {"decode": 1.2, "ttft": 0.7}})
    outcome = run_bench(load_gate_config(path))
    result = outcome.result
    assert result.method is (Method.STREAM if stream else Method.TWO_REQUEST)
    ladder = result.rungs[0]
    assert ladder.rung.name == "16/9" and ladder.reference.tokens == ladder.candidate.tokens == 9
    assert within(ladder.reference.ttft_s.median, TTFT) and within(ladder.candidate.ttft_s.median, TTFT)
    assert within(ladder.reference.decode_tok_s.median, 1 / (2 * PER_TOKEN))
    assert within(ladder.candidate.decode_tok_s.median, 1 / PER_TOKEN)
    assert within(ladder.reference.e2e_tok_s.median, 9 / (TTFT + 8 * 2 * PER_TOKEN))
    gate = result.rungs[1]
    assert gate.rung.prompts == 2 and gate.reference.tokens == 4
    assert within(gate.reference.ttft_s.median, TTFT)
    # every figure is 1.4x or more past its bar, but 2 x 2 runs cannot reach a 95 % interval at all
    assert result.verdict.kind is SpeedVerdictKind.NOT_SEPARABLE and result.verdict.exit_code == 3
    assert all("reach only 67% confidence" in r and "about 4 runs per arm" in r for r in result.verdict.reasons)
    assert any("concurrency 2 skipped" in n and "command" in n for n in result.notes)
    assert outcome.path.parent.parent == tmp_path / "out" and outcome.path.parent.name.startswith("speed-test-")
    data = json.loads(outcome.path.read_text())
    assert data["method"] == result.method.value and data["verdict"] == "not_separable"
    assert data["order"] == "sequential" and data["arms"] == {"candidate": "command", "reference": "command"}


def test_one_arm_not_streaming_means_two_request_for_both(tmp_path, virtual_clock):
    path = gate_file(tmp_path, command_arm("--stream", clock=virtual_clock), command_arm(clock=virtual_clock),
                     {"warmup": 0, "runs": 1, "rungs": ["8/5"]})
    result = run_bench(load_gate_config(path)).result
    assert result.method is Method.TWO_REQUEST
    assert within(result.rungs[0].reference.decode_tok_s.median, 1 / PER_TOKEN)


def test_ignore_eos_is_sent_and_the_real_count_recorded(tmp_path):
    # --eos-at 3 stops at 3 tokens unless the request says ignore_eos: the gate always does
    path = gate_file(tmp_path, command_arm("--eos-at", "3", "--per-token", "0.01"),
                     command_arm("--per-token", "0.01"), {"warmup": 0, "runs": 1, "rungs": ["8/6"]})
    result = run_bench(load_gate_config(path)).result
    assert result.rungs[0].reference.tokens == result.rungs[0].candidate.tokens == 6
    assert not result.mismatches


def test_rungs_over_the_context_are_dropped_and_hello_settings_matched(tmp_path):
    ref = command_arm("--per-token", "0.01", "--hello-json", '{"max_context": 64, "eager": true, "dtype": "float32"}')
    cand = command_arm("--per-token", "0.01", "--hello-json", '{"eager": false, "dtype": "bfloat16"}')
    path = gate_file(tmp_path, ref, cand, {"warmup": 0, "runs": 1, "rungs": ["8/4", "128/8"], "min_speed_ratio": 0.5})
    result = run_bench(load_gate_config(path)).result
    assert [r.rung.name for r in result.rungs] == ["8/4"]
    assert any("128/8 dropped" in n and "(64)" in n for n in result.notes)
    flagged = {m.field: m.flattering for m in result.mismatches}
    assert flagged == {"eager": True, "dtype": True}


def test_a_bar_not_met_exits_4_and_an_engine_that_dies_is_incomplete(tmp_path, virtual_clock):
    path = gate_file(tmp_path, command_arm("--per-token", "0.01", clock=virtual_clock),
                     command_arm("--per-token", "0.01", clock=virtual_clock),
                     {"warmup": 0, "runs": 4, "rungs": ["8/4"], "min_speed_ratio": {"decode": 10.0}})
    result = runner.invoke(app, ["bench", str(path)])
    assert result.exit_code == 4, result.output
    assert "speed: fail" in result.output and "8/4" in result.output
    dead = {"kind": "command", "command": [sys.executable, "-c", "import sys; sys.exit(5)"], "tokenizer": "bundled:tiny-llama"}
    path = gate_file(tmp_path, dead, command_arm(), {"warmup": 0, "runs": 1, "rungs": ["gate"], "min_speed_ratio": 1.0})
    result = runner.invoke(app, ["bench", str(path)])
    assert result.exit_code == 3, result.output
    assert "not measured" in result.output


def test_an_engine_that_dies_mid_ladder_is_not_restarted(tmp_path):
    path = gate_file(tmp_path, command_arm("--per-token", "0.01", "--die-after", "1"), command_arm("--per-token", "0.01"),
                     {"warmup": 0, "runs": 2, "rungs": ["8/4", "gate"], "min_speed_ratio": 0.5})
    result = run_bench(load_gate_config(path)).result
    first, gate = result.rungs
    assert "exited with code 7" in first.error and first.reference is None and first.candidate is not None
    assert "not run: the engine failed on rung 8/4" in gate.error
    assert result.verdict.kind is SpeedVerdictKind.INCOMPLETE and result.verdict.exit_code == 3


def jittery(per_token: float, seed: int, clock: Path) -> dict[str, Any]:
    """A streaming engine whose every request is scaled by a seeded factor in [e^-0.3, e^0.3]."""
    return command_arm("--stream", "--ttft", "0.05", "--per-token", str(per_token), "--jitter", "0.3",
                       "--seed", str(seed), clock=clock)


@pytest.mark.parametrize("interleave", [False, True])
def test_the_interval_holds_the_true_ratio_and_a_bar_inside_it_is_not_separable(tmp_path, interleave,
                                                                                  virtual_clock):
    # decode: the candidate pauses 0.02 s a token, the reference 0.04 s: the true ratio is 2.0,
    # each request scaled by up to +-35 % (seeded, in virtual time: the same spread on any machine)
    speed = {"warmup": 0, "runs": 6, "rungs": ["4/9"], "min_speed_ratio": {"decode": 2.0}}
    path = gate_file(tmp_path, jittery(0.04, 1, virtual_clock), jittery(0.02, 2, virtual_clock), speed)
    outcome = run_bench(load_gate_config(path), interleave=interleave)
    result = outcome.result
    assert result.order.value == ("interleaved" if interleave else "sequential")
    (rung,) = result.rungs
    decode = rung.ratio(FigureName.DECODE).interval
    assert decode is not None and decode.reached and decode.confidence > 0.95
    assert decode.lower < 2.0 < decode.upper and decode.upper / decode.lower > 1.1  # a real interval, holding 2.0
    ttft = rung.ratio(FigureName.TTFT).interval
    assert ttft is not None and ttft.lower < 1.0 < ttft.upper  # the same first-token sleep: 1.0 inside
    assert not rung.ratio(FigureName.TTFT).separable and rung.ratio(FigureName.DECODE).separable
    assert result.verdict.kind is SpeedVerdictKind.NOT_SEPARABLE and result.verdict.exit_code == 3
    (reason,) = result.verdict.reasons
    assert "rung 4/9: decode speed" in reason and "not separable from the bar 2x at 6 runs" in reason
    assert "runs per arm would separate it" in reason
    # the same figures against bars on either side of the interval: a pass, a fail
    for bar, kind in ((decode.lower * 0.99, SpeedVerdictKind.PASS), (decode.upper * 1.01, SpeedVerdictKind.FAIL)):
        assert judge_speed(result.rungs, {"decode": bar}, method=result.method).kind is kind
    data = json.loads(outcome.path.read_text())
    shown = data["rungs"][0]["ratio"]["decode_tok_s"]
    assert shown["interval"] == [round(decode.lower, 6), round(decode.upper, 6)] and shown["separable"] is True


@pytest.mark.parametrize("interleave, order", [(False, "CCCCRRRR"), (True, "RRCCCCRR")])
def test_interleaved_repetitions_take_turns_abba(tmp_path, interleave, order):
    """Each engine logs every request as it arrives (two a repetition: max_tokens=1, then the
    full one): one arm after the other without --interleave, ABBA with it."""
    log = tmp_path / "arrivals"
    ref, cand = (command_arm("--ttft", "0.01", "--per-token", "0.01", "--log", str(log), "--tag", tag) for tag in "RC")
    path = gate_file(tmp_path, ref, cand, {"warmup": 0, "runs": 2, "rungs": ["4/2"]})
    result = run_bench(load_gate_config(path), interleave=interleave).result
    assert "".join(log.read_text().split()) == order
    assert result.order.value == ("interleaved" if interleave else "sequential")
    assert result.rungs[0].reference is not None and result.rungs[0].candidate is not None


def test_gate_with_speed_keeps_the_token_verdict_and_adds_the_speed_exit_code(tmp_path, virtual_clock):
    from strict_gate.gate.run import run_gate

    speed = {"warmup": 0, "runs": 4, "rungs": ["8/4"], "min_speed_ratio": {"decode": 10.0}}
    path = gate_file(tmp_path, command_arm("--per-token", "0.01", clock=virtual_clock),
                     command_arm("--per-token", "0.01", clock=virtual_clock), speed,
                     policy="strict")
    outcome = run_gate(load_gate_config(path))
    assert outcome.result.verdict.verdict == "pass"  # the tokens are equal
    assert outcome.result.features["speed"].verdict.kind is SpeedVerdictKind.FAIL
    assert outcome.result.exit_code == 4


# ---------------------------------------------------------------------------- the openai kind


@pytest.fixture
def paced_servers(fake_openai):
    """Two fake OpenAI servers of known speed: the reference decodes at half the candidate's rate."""
    return [fake_openai(pace=(TTFT, per_token)).url for per_token in (2 * PER_TOKEN, PER_TOKEN)]


def test_openai_kind_streams_and_serves_concurrent_sequences(tmp_path, paced_servers):
    ref, cand = ({"kind": "openai", "base_url": url, "tokenizer": "bundled:tiny-llama", "retries": 0} for url in paced_servers)
    path = gate_file(tmp_path, ref, cand, {"warmup": 0, "runs": 2, "rungs": ["8/9"], "concurrency": [1, 2]})
    result = run_bench(load_gate_config(path)).result
    assert result.method is Method.STREAM
    assert [r.rung.name for r in result.rungs] == ["8/9", "8/9@2"]
    for rung, seqs in zip(result.rungs, (1, 2)):
        assert within(rung.reference.ttft_s.median, TTFT), rung
        assert within(rung.reference.decode_tok_s.median, seqs / (2 * PER_TOKEN)), rung
        assert within(rung.candidate.decode_tok_s.median, seqs / PER_TOKEN), rung
        assert rung.reference.tokens == 9


# ---------------------------------------------------------------------------- matched check


def arm(**settings) -> ArmMeasurement:
    return ArmMeasurement("x", settings, False, {})


def test_matched_check_flags_a_flattering_denominator_and_states_the_unknown():
    eager, compiled = arm(eager=True, dtype="float32"), arm(eager=False, dtype="float32")
    (m,), notes = check_matched(eager, compiled, ())
    assert (m.field, m.flattering) == ("eager", True)
    (m,), _ = check_matched(compiled, eager, ())  # the reverse is flagged too: the ratio compares compilation
    assert (m.field, m.flattering) == ("eager", True) and "understates" in m.message
    assert check_matched(eager, arm(eager=True, dtype="float32"), ())[0] == ()
    assert "kv_cache" in notes[0] and "prefix_cache" in notes[0]


def test_a_launched_vllm_server_states_its_settings_from_its_flags():
    from strict_gate.engines.vllm.args import vllm_serve_settings

    argv = ["vllm", "serve", "m", "--dtype", "float32", "--enforce-eager", "--max-model-len=512",
            "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.3"]
    assert vllm_serve_settings(argv) == {"dtype": "float32", "eager": True, "kv_cache": "gpu_memory_utilization=0.3",
                                         "prefix_cache": False, "max_context": 512}
    assert vllm_serve_settings(["vllm", "serve", "m"])["eager"] is False  # vLLM compiles by default
    assert vllm_serve_settings(["./my-server", "--port", "1"]) == {}


# ---------------------------------------------------------------------------- properties


samples = st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=9)


@settings(max_examples=300, deadline=None)
@given(samples, samples)
def test_the_interval_holds_its_estimate_and_swapping_the_arms_inverts_it(cand, ref):
    ratio = Ratio.of(Figure(tuple(cand)), Figure(tuple(ref)))
    i = ratio.interval
    assert i.lower <= i.estimate <= i.upper
    pairs = [c / r for c in cand for r in ref]
    assert min(pairs) * (1 - 1e-9) <= i.lower and i.upper <= max(pairs) * (1 + 1e-9)
    # the widest interval (every pairwise ratio) has confidence 1 - 2 / C(m + n, m): 95 % needs C >= 40
    assert (i.confidence >= 0.95) == (math.comb(len(cand) + len(ref), len(cand)) >= 40 and not i.tied)
    assert i.tied == (i.lower == i.upper and len(cand) * len(ref) > 1)  # ties carry no confidence (issue 26, item 18)
    swapped = Ratio.of(Figure(tuple(ref)), Figure(tuple(cand))).interval
    assert math.isclose(swapped.estimate, 1 / i.estimate, rel_tol=1e-9)
    assert math.isclose(swapped.lower, 1 / i.upper, rel_tol=1e-9) and math.isclose(swapped.upper, 1 / i.lower, rel_tol=1e-9)
    assert swapped.confidence == i.confidence and ratio.separable == Ratio.of(Figure(tuple(ref)), Figure(tuple(cand))).separable
    assert ratio.separable == (i.confidence >= 0.95 and not i.lower <= 1.0 <= i.upper)


@settings(max_examples=200, deadline=None)
@given(samples, samples, st.floats(min_value=0.1, max_value=10))
def test_a_bar_passes_only_above_the_whole_interval_and_fails_only_below_it(cand, ref, bar):
    r = Rung("8/4", 8, 4)
    figs = {name: Figure(tuple(cand)) for name in ("ttft_s", "decode_tok_s", "e2e_tok_s")}
    refs = {name: Figure(tuple(ref)) for name in ("ttft_s", "decode_tok_s", "e2e_tok_s")}
    rung = RungResult(r, ArmFigures(**refs, tokens=4), ArmFigures(**figs, tokens=4), token_check=TokenCheck(checked=1))
    i = rung.ratio(FigureName.DECODE).interval
    kind = judge_speed([rung], {"decode": bar}, method=Method.STREAM).kind
    if kind is SpeedVerdictKind.PASS:
        assert i.reached and i.lower >= bar
    elif kind is SpeedVerdictKind.FAIL:
        assert i.reached and i.upper < bar
    else:
        assert kind is SpeedVerdictKind.NOT_SEPARABLE and (not i.reached or i.lower < bar <= i.upper)


def test_gate_on_a_recorded_baseline_times_the_rescorer_as_the_speed_reference(tmp_path):
    from strict_gate.gate.run import run_gate

    engine = tmp_path / "engine.toml"
    engine.write_text(toml_text(command_arm("--per-token", "0.01") | {"model": "speed-model"}))
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("\n".join((ROOT / "prompts" / "smoke.jsonl").read_text().splitlines()[:2]) + "\n")
    baseline = tmp_path / "baseline"
    made = runner.invoke(app, ["run", str(engine), "--prompts", str(prompts), "--out", str(baseline),
                               "--max-tokens", "4"])
    assert made.exit_code == 0, made.output
    recorded = {"kind": "recorded", "path": baseline, "model": "speed-model"}
    rescorer = command_arm("--per-token", "0.01") | {"model": "speed-model"}
    path = gate_file(tmp_path, recorded, command_arm("--per-token", "0.01"), {"warmup": 0, "runs": 1, "rungs": ["8/4"]},
                     rescorer=rescorer)
    outcome = run_gate(load_gate_config(path))
    assert outcome.result.verdict.verdict == "pass" and outcome.result.exit_code == 0
    speed = outcome.result.features["speed"]
    assert speed.rungs[0].reference is not None and speed.rungs[0].error is None
    assert any("[rescorer]" in n for n in speed.notes)


def test_an_arm_whose_token_run_failed_is_not_restarted_to_be_timed(tmp_path):
    from strict_gate.gate.run import run_gate

    path = gate_file(tmp_path, command_arm("--per-token", "0.01"), command_arm("--per-token", "0.01", "--die-after", "1"),
                     {"warmup": 0, "runs": 1, "rungs": ["8/4"], "min_speed_ratio": 0.5})
    result = run_gate(load_gate_config(path)).result
    assert result.verdict.verdict == "incomplete" and result.exit_code == 3  # the token verdict's code
    assert "candidate's token run did not complete" in result.features["speed"].rungs[0].error
    assert result.features["speed"].rungs[0].reference is not None


# ---------------------------------------------------------------------------- the timed-token check


def timed(*records, request=Request.FULL) -> ArmRung:
    return ArmRung(timed={(0, request, r.id): r for r in records})


RULES = TokenRules(top_logprobs=5, band=0.5, greedy_tolerance=1e-3)
LADDER_RUNG, GATE_RUNG = Rung("8/4", 8, 4), Rung("gate", None, 4)


def test_timed_replies_verify_at_a_near_tie_and_not_past_one():
    ref = rec("p", [5, 6, 7, 8])
    tie = (confident(5), step((9, -0.69), (6, -0.70)), confident(9), confident(8))  # 6 and 9 0.01 nats apart
    near = rec("p", [5, 9, 9, 8], tops=tie)
    ref_tie = rec("p", [5, 6, 7, 8], tops=(confident(5), step((6, -0.69), (9, -0.70)), confident(7), confident(8)))
    # the tie flipped at the last token both replies were asked for verifies; with tokens after it,
    # or stopped (finish "stop", no EOS) short of max_tokens after it, those are not judged
    last = {"reference": timed(rec("p", [5, 6], tops=ref_tie.top_logprobs[:2])),
            "candidate": timed(rec("p", [5, 9], tops=tie[:2]))}
    assert check_tokens(Rung("8/2", 8, 2), last, {}, RULES) == TokenCheck(checked=1)
    stopped = check_tokens(LADDER_RUNG, last, {}, RULES)
    assert stopped.verified is False and "stopped after 2 of 4 tokens" in stopped.problems[0]
    after = check_tokens(LADDER_RUNG, {"reference": timed(ref_tie), "candidate": timed(near)}, {}, RULES)
    assert after.verified is False and "positions 2-3 after the flip not judged" in after.problems[0]
    check = check_tokens(LADDER_RUNG, {"reference": timed(ref), "candidate": timed(rec("p", [5, 0, 0, 0]))}, {}, RULES)
    assert check.verified is False and check.unverified == 1
    assert "the candidate's full reply to 'p' (repetition 0) against the reference's: divergent at position 1" \
        in check.problems[0]


def test_a_timed_reply_that_is_not_its_own_argmax_does_not_verify():
    # the tokens are the reference's, but the candidate's own logprobs rank another token first
    lying = rec("p", [5, 6], tops=(confident(5), step((6, -2.0), (4, -0.1))))
    check = check_tokens(LADDER_RUNG, {"reference": timed(rec("p", [5, 6])), "candidate": timed(lying)}, {}, RULES)
    assert check.verified is False and "not_greedy" in check.problems[0]


def test_the_gate_rung_checks_each_arm_against_its_own_gate_records_over_their_length():
    gate = {"reference": {"p": rec("p", [5, 2], finish="stop")}, "candidate": {"p": rec("p", [5, 2], finish="stop")}}
    honest = rec("p", [5, 2, 7, 8], finish="length")  # ignore_eos: the timed reply runs past the EOS (2)
    arms = {"reference": timed(honest), "candidate": timed(honest)}
    assert check_tokens(GATE_RUNG, arms, gate, RULES) == TokenCheck(checked=2)  # one own check per arm
    arms["candidate"] = timed(rec("p", [5, 3, 7, 8], finish="length"))
    check = check_tokens(GATE_RUNG, arms, gate, RULES)
    assert check.unverified == 1 and "the candidate's full reply to 'p'" in check.problems[0] \
        and "against its own gate record" in check.problems[0]
    # without gate records (strict-gate bench) the arms are checked against each other
    assert check_tokens(GATE_RUNG, arms, {}, RULES).unverified == 1


def test_nothing_checked_is_never_verified():
    assert TokenCheck().verified is None
    rung = RungResult(LADDER_RUNG, arm_figures(), arm_figures())
    verdict = judge_speed([rung], {"decode": 0.5}, method=Method.STREAM)
    assert verdict.kind is SpeedVerdictKind.NOT_COMPARABLE and "no timed reply could be checked" in verdict.reasons[0]
    checked = replace(rung, token_check=TokenCheck(checked=1))
    assert judge_speed([checked], {"decode": 0.5}, method=Method.STREAM).kind is SpeedVerdictKind.PASS


def arm_figures() -> ArmFigures:
    """Four runs: the fewest whose interval can reach 95 %."""
    return ArmFigures(Figure((0.2, 0.21, 0.19, 0.2)), Figure((20.0, 20.5, 19.5, 20.2)), Figure((15.0, 15.2, 14.9, 15.1)),
                      tokens=4)


def test_matched_check_compares_the_device_and_the_attention_backend():
    """Another device is flagged both ways (the ratio compares hardware); another attention backend
    between two vLLM arms is a named mismatch; across engine kinds it is stated in a note (each
    engine names its own kernels), and vLLM's "auto" (its selector, not read back) is unstated."""
    def on(kind, **s):
        return ArmMeasurement(kind, s, False, {})

    (m,), _ = check_matched(on("vllm", device="cpu"), on("vllm", device="cuda"), ())
    assert (m.field, m.flattering) == ("device", True) and "hardware" in m.message
    (m,), _ = check_matched(on("vllm", device="cuda"), on("hf", device="cpu"), ())
    assert (m.field, m.flattering) == ("device", True)
    (m,), _ = check_matched(on("vllm", attention_backend="FLASH_ATTN"), on("vllm", attention_backend="TRITON_ATTN"), ())
    assert (m.field, m.flattering, m.reference, m.candidate) == ("attention_backend", False, "FLASH_ATTN", "TRITON_ATTN")
    found, notes = check_matched(on("vllm", attention_backend="FLASH_ATTN"), on("hf", attention_backend="sdpa"), ())
    assert found == () and any("FLASH_ATTN" in n and "sdpa" in n and "not compared" in n for n in notes)
    found, notes = check_matched(on("vllm", attention_backend="auto"), on("vllm", attention_backend="FLASH_ATTN"), ())
    assert found == () and "attention_backend" in notes[0] and "device" in notes[0]


def test_vllm_states_its_device_and_backend_for_the_speed_check():
    from strict_gate.engines.vllm.args import vllm_speed_settings
    from strict_gate.engines.vllm.options import VLLMOptions

    opts = VLLMOptions(model="m", engine_args={"attention_backend": "FLASH_ATTN"})
    got = vllm_speed_settings(opts, {"device_type": "cuda", "attention_backend": "auto"}, "/nonexistent")
    assert (got["device"], got["attention_backend"]) == ("cuda", "FLASH_ATTN")
    got = vllm_speed_settings(VLLMOptions(model="m"), {"attention_backend": "TRITON_ATTN (from VLLM_ATTENTION_BACKEND)"},
                              "/nonexistent")
    assert (got["device"], got["attention_backend"]) == (None, "TRITON_ATTN")
