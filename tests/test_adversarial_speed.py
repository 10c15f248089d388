"""Hostile engines against the speed arm: each tries to talk it into a pass (issue 16, items
2-5, and the speed part of 22). Each test failed on the code before the speed arm verified
what it times.

The engines are real processes over the command protocol: tests/engines/hostile_speed_engine.py
(one trick each) against tests/engines/speed_engine.py (honest). Their pauses (0.2 s before the
first token, 0.05 s per later one, 1.5 s for a slow first request) move a ratio by 1.5x or
more; a test whose verdict rests on a ratio runs them in virtual time (the `virtual_clock`
fixture, tests/virtual_clock.py: the engines add their pauses to the clock the measurement
reads), so that its verdict does not depend on the machine's load (issue 50, item 9: a loaded
2-core CI machine made a pass "not separable"). The tests assert verdicts and exit codes, not
timings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import section
from typer.testing import CliRunner

from strict_gate.cli import app

ROOT = Path(__file__).resolve().parents[1]
ENGINES = Path(__file__).parent / "engines"
HOSTILE = ENGINES / "hostile_speed_engine.py"
HONEST = ENGINES / "speed_engine.py"
runner = CliRunner()


def arm(script: Path, *flags: str, clock: Path | None = None) -> str:
    """A command arm; with `clock`, in virtual time (the virtual_clock fixture's file)."""
    argv = json.dumps(["python", str(script), *flags, *(("--clock", str(clock)) if clock else ())])
    return f'kind = "command"\ncommand = {argv}\ntokenizer = "bundled:tiny-llama"\n'


def config(tmp_path: Path, reference: str, candidate: str, speed: str, runs: int = 1) -> Path:
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("\n".join((ROOT / "prompts" / "smoke.jsonl").read_text().splitlines()[:2]) + "\n")
    path = tmp_path / "gate.toml"
    path.write_text(
        f'name = "hostile"\nprompts = "{prompts}"\nmax_tokens = 4\npolicy = "strict"\n'
        f'output_dir = "{tmp_path / "out"}"\n[reference]\n{reference}\n[candidate]\n{candidate}\n'
        f"[speed]\nwarmup = 0\nruns = {runs}\n{speed}\n"
    )
    return path


def bench(tmp_path: Path, reference: str, candidate: str, speed: str, runs: int = 1) -> tuple[int, str, dict]:
    """`strict-gate bench`; a verdict below the bar needs 4 runs (the fewest for a 95 % interval)."""
    result = runner.invoke(app, ["bench", str(config(tmp_path, reference, candidate, speed, runs))],
                           terminal_width=200)
    (written,) = (tmp_path / "out").glob("hostile-*/speed.json")
    data = json.loads(written.read_text())
    return result.exit_code, result.output, data


# ---------------------------------------------------------------------------- item 2: stream events


def test_events_written_at_once_before_a_slow_reply_get_no_fast_decode(tmp_path, virtual_clock):
    code, out, data = bench(tmp_path, arm(HONEST, "--stream", clock=virtual_clock),
                            arm(HOSTILE, "--trick", "burst", "--stream", clock=virtual_clock),
                            'rungs = ["8/8"]\nmin_speed_ratio = { decode = 3.0 }', runs=4)
    assert data["method"] == "stream"
    assert code == 4 and data["verdict"] == "fail", out  # was: decode in the thousands, a pass
    assert "rung 8/8: decode speed" in out


def test_token_events_must_carry_the_replys_token_ids(tmp_path):
    code, out, data = bench(tmp_path, arm(HONEST, "--stream"), arm(HOSTILE, "--trick", "event-ids", "--stream"),
                            'rungs = ["8/4"]\nmin_speed_ratio = { decode = 0.5 }')
    assert code == 3 and data["verdict"] == "incomplete", out  # was: accepted, only the count compared
    assert "token event 0 carries token 999" in data["rungs"][0]["error"]


# ---------------------------------------------------------------------------- item 3: timed tokens


def test_zeros_answered_instantly_to_timed_requests_fail(tmp_path):
    code, out, data = bench(tmp_path, arm(HONEST, "--stream"), arm(HOSTILE, "--trick", "zeros", "--stream"),
                            'rungs = ["8/8"]\nmin_speed_ratio = { decode = 1.0, e2e = 1.0 }')
    assert data["method"] == "stream"
    # was: decode and e2e in the thousands, a pass; then not comparable (exit 4); timed tokens that
    # do not verify fail (exit 1, issue 49)
    assert code == 1 and data["verdict"] == "tokens_not_verified", out
    check = data["rungs"][0]["token_check"]
    assert check["verified"] is False and check["unverified"] == check["checked"] == 2  # the TTFT and the full reply
    reason = data["speed_verdict"]["reasons"][0]
    assert "the candidate's full reply to '8/8#0-full-0' (repetition 0) against the reference's: divergent at " \
           "position 0" in reason
    assert "timed tokens: not verified on rung 8/8" in out


def test_zeros_on_the_gate_rung_disagree_with_the_arms_own_gate_tokens(tmp_path):
    path = config(tmp_path, arm(HONEST, "--per-token", "0.01"), arm(HOSTILE, "--trick", "zeros", "--per-token", "0.01"),
                  'rungs = ["gate"]\nmin_speed_ratio = { decode = 1.0 }')
    result = runner.invoke(app, ["gate", str(path)], terminal_width=200)
    assert result.exit_code == 1, result.output  # the gate's own tokens pass; the timed ones fail it
    (report,) = (tmp_path / "out").glob("hostile-*/report.json")
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "pass" and section(rep, "speed")["verdict"] == "tokens_not_verified"
    assert "against its own gate record (as reference)" in section(rep, "speed")["speed_verdict"]["reasons"][0]


# ---------------------------------------------------------------------------- item 4: the two-request method


def test_a_slow_max_tokens_1_request_does_not_flatter_two_request_decode(tmp_path, virtual_clock):
    # the full request takes 1.5 s to its first token, then 0.03 s per token: derived decode
    # (n - 1) / (t_full - TTFT) is 1.7x the honest reference's while e2e is 0.5x
    code, out, data = bench(tmp_path, arm(HONEST, clock=virtual_clock),
                            arm(HOSTILE, "--trick", "slow-first", "--per-token", "0.03", clock=virtual_clock),
                            'rungs = ["8/16"]\nmin_speed_ratio = { decode = 1.3 }', runs=4)
    assert data["method"] == "two-request"
    assert code == 4 and data["verdict"] == "fail", out  # was: a pass on decode alone
    failed = [c for c in data["speed_verdict"]["checks"] if not c["passed"]]
    assert [(c["figure"], c["bar"]) for c in failed] == [("e2e_tok_s", "decode")]
    assert "held against e2e" in out and "biased" in out  # the method states its bias


def test_the_gate_rung_ttft_request_shares_no_cached_prompt_with_the_full_request(tmp_path, virtual_clock):
    code, out, data = bench(tmp_path, arm(HONEST, "--stream", clock=virtual_clock),
                            arm(HOSTILE, "--trick", "cache", "--stream", clock=virtual_clock),
                            'rungs = ["gate"]\nmin_speed_ratio = { ttft = 2.0 }', runs=4)
    assert data["method"] == "stream"
    assert code == 4 and data["verdict"] == "fail", out  # was: TTFT read from a cached prompt, 4x, a pass
    assert any("fresh prompt" in n for n in data["notes"])


# ---------------------------------------------------------------------------- item 5: flattering mismatches


@pytest.mark.parametrize("ref_hello, cand_hello, field", [
    ({"eager": True}, {"eager": False}, "eager"),
    ({"dtype": "float32"}, {"dtype": "bfloat16"}, "dtype"),
    ({"prefix_cache": False}, {"prefix_cache": True}, "prefix_cache"),
])
def test_a_flattering_mismatch_blocks_a_speed_pass(tmp_path, ref_hello, cand_hello, field):
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01", "--hello-json", json.dumps(ref_hello)),
                            arm(HONEST, "--per-token", "0.01", "--hello-json", json.dumps(cand_hello)),
                            'rungs = ["8/4"]\nmin_speed_ratio = { decode = 0.5 }')
    assert code == 4 and data["verdict"] == "not_comparable", out  # was: pass, exit 0
    assert data["matched"] is False and f"not comparable: {field} (" in data["speed_verdict"]["reasons"][0]
    assert "speed: not comparable" in out


# ---------------------------------------------------------------------------- item 22: claims about nothing


def test_matched_is_not_claimed_when_every_rung_was_dropped(tmp_path):
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01"),
                            arm(HONEST, "--per-token", "0.01", "--hello-json", '{"max_context": 8}'),
                            'rungs = ["8/4"]')
    assert data["rungs"] == [] and data["matched"] is None  # was: "matched": true
    assert "matched: not checked" in out and "matched: yes" not in out


def test_matched_is_not_claimed_when_no_rung_was_measured_on_both_arms(tmp_path):
    dead = arm(HONEST).replace(f'"{HONEST}"', '"-c", "import sys; sys.exit(5)"')
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01"), dead, 'rungs = ["8/4"]')
    assert data["rungs"][0]["error"] and data["matched"] is None  # was: "matched": true
    assert "matched: yes" not in out


def test_an_unknown_context_is_not_claimed_beside_a_stated_one(tmp_path):
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01"),
                            arm(HONEST, "--per-token", "0.01", "--hello-json", '{"max_context": 64}'),
                            'rungs = ["8/4", "128/8"]')
    assert any("128/8 dropped" in n and "candidate's max context (64)" in n for n in data["notes"])
    assert not any("unknown" in n for n in data["notes"]), data["notes"]  # was: both, side by side


# ---------------------------------------------------------------------------- issue 26, item 16: nothing measured


def test_a_bench_that_measured_nothing_on_an_arm_is_incomplete_without_a_bar(tmp_path):
    """The candidate dies before its first timed request, no min_speed_ratio: every rung is
    "not measured" on it. Was: exit 0, "speed: informational"."""
    dead = arm(HONEST).replace(f'"{HONEST}"', '"-c", "import sys; sys.exit(5)"')
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01"), dead, 'rungs = ["8/4"]')
    assert code == 3 and data["verdict"] == "incomplete", out
    assert "nothing was measured on the candidate" in " ".join(data["speed_verdict"]["reasons"])


def test_a_bench_whose_every_rung_was_dropped_is_incomplete_without_a_bar(tmp_path):
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01"),
                            arm(HONEST, "--per-token", "0.01", "--hello-json", '{"max_context": 8}'), 'rungs = ["8/4"]')
    assert data["rungs"] == [] and code == 3 and data["verdict"] == "incomplete", out  # was: exit 0


# ---------------------------------------------------------------------------- issue 26, item 18: the interval


def test_an_inverted_interval_of_an_underflowed_estimate_does_not_raise():
    """A reference of 1e200 tok/s against 1e-200: the estimate underflows to 0. Was:
    ZeroDivisionError from Interval.inverted() through the Python API."""
    from strict_gate.speed.interval import ratio_interval

    i = ratio_interval([1e-200] * 4, [1e200] * 4)
    assert i is not None and i.estimate == 0.0
    inv = i.inverted()
    assert inv.estimate == math.inf and inv.lower == math.inf and not inv.reached


def test_all_equal_samples_are_not_certainty():
    """5 x 5 identical repetitions on both arms (a timer at its resolution): was a zero-width
    interval [1, 1] at 96.8 % that passed a bar of 1.0."""
    from strict_gate.speed.interval import ratio_interval
    from strict_gate.speed.model import (
        ArmFigures,
        Figure,
        Method,
        Rung,
        RungResult,
        SpeedVerdictKind,
        TokenCheck,
    )
    from strict_gate.speed.verdict import judge_speed

    figs = ArmFigures(Figure((0.5,) * 5), Figure((20.0,) * 5), Figure((20.0,) * 5), tokens=4)
    rung = RungResult(Rung("8/4", 8, 4), figs, figs, token_check=TokenCheck(checked=1))
    verdict = judge_speed([rung], {"decode": 1.0}, method=Method.STREAM)
    assert verdict.kind is SpeedVerdictKind.NOT_SEPARABLE and verdict.exit_code == 3
    (reason,) = verdict.reasons
    assert "samples tie" in reason and "runs per arm would separate" not in reason
    i = ratio_interval([0.5] * 5, [0.5] * 5)
    assert i is not None and i.tied and not i.reached


# ---------------------------------------------------------------------------- issue 36: a near-tie, then what?


def test_timed_tokens_after_a_near_tie_flip_are_not_verified(tmp_path):
    """Both arms see a 0.01-nat tie at position 1 of every timed reply; the candidate takes the
    runner-up, then answers zeros to the end. The first divergence alone is a near-tie; the six
    tokens after it nobody judged, so the rung is not verified, which fails the gate (exit 1)."""
    code, out, data = bench(tmp_path, arm(HOSTILE, "--trick", "tie", "--per-token", "0.01"),
                            arm(HOSTILE, "--trick", "tie-garbage", "--per-token", "0.01"),
                            'rungs = ["8/8"]\nmin_speed_ratio = { e2e = 0.1 }', runs=4)
    assert code == 1 and data["verdict"] == "tokens_not_verified", out  # before: verified, a speed pass
    check = data["rungs"][0]["token_check"]
    assert check["verified"] is False
    assert "near_tie at position 1" in data["speed_verdict"]["reasons"][0]
    assert "positions 2-7 after the flip not judged" in data["speed_verdict"]["reasons"][0]


def test_timed_tokens_with_a_tie_the_candidate_does_not_flip_verify(tmp_path):
    """The control: the same tie on both arms, neither flips it: verified."""
    code, out, data = bench(tmp_path, arm(HOSTILE, "--trick", "tie", "--per-token", "0.01"),
                            arm(HOSTILE, "--trick", "tie", "--per-token", "0.01"), 'rungs = ["8/8"]')
    assert data["rungs"][0]["token_check"]["verified"] is True, out


@pytest.mark.parametrize("reference", ["honest", "eos-emitted"])
def test_a_masked_eos_is_not_a_greedy_violation_when_eos_was_ignored(tmp_path, reference):
    """The speed arm asks for ignore_eos; an engine that honours it as transformers does masks the
    EOS and lists it above the token it emits (its logprobs are read before the mask). That EOS
    was banned, so it is not the reply's top-1 to be greedy against; and where the other arm
    emitted the EOS as an ordinary token (vLLM), the replies are compared before it (which an EOS
    met on the way does is not compared). Both verify. No bar: the verdict is the tokens', and a
    bar over these replies (answered at once) would be judged on the machine's load alone."""
    ref = arm(HONEST, "--per-token", "0.01") if reference == "honest" else \
        arm(HOSTILE, "--trick", "eos-emitted", "--per-token", "0.01")
    code, out, data = bench(tmp_path, ref, arm(HOSTILE, "--trick", "eos-masked", "--per-token", "0.01"),
                            'rungs = ["8/8"]', runs=4)
    check = data["rungs"][0]["token_check"]
    assert check["verified"] is True, (check, out)  # before: "not_greedy ... below its own top-1 2"
    assert code == 0 and data["verdict"] == "informational", out  # nothing blocks the figures


def test_an_eos_the_reply_was_not_told_to_ignore_still_counts(tmp_path):
    """A reply whose top-1 is an ordinary token it did not emit is not greedy, EOS ids dropped or
    not: the check drops the banned EOS only."""
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01"),
                            arm(HOSTILE, "--trick", "tie-garbage", "--per-token", "0.01"),
                            'rungs = ["8/8"]\nmin_speed_ratio = { e2e = 0.1 }', runs=4)
    assert code == 1 and data["rungs"][0]["token_check"]["verified"] is False, out


# ---------------------------------------------------------------------------- issue 50, item 9: no verdict on the load


def test_a_loaded_machine_does_not_move_a_speed_verdict(tmp_path, virtual_clock, monkeypatch):
    """Two honest engines of the same speed against an e2e bar of 0.5x: a pass. The gate's own
    process is stalled 0.3 s on every third request, as a loaded CI machine stalls it (in wall
    time that alone makes the ratio "not separable", as on the 2-core CI run of issue 50); the
    measurement reads the virtual clock the engines advance, so the verdict stays a pass."""
    import time

    from strict_gate.engines.command.engine import CommandEngine

    calls, generate = [], CommandEngine.generate

    def stalled(self, prompts, sampling):
        calls.append(1)
        if len(calls) % 3 == 0:
            time.sleep(0.3)
        return generate(self, prompts, sampling)

    monkeypatch.setattr(CommandEngine, "generate", stalled)
    code, out, data = bench(tmp_path, arm(HONEST, "--per-token", "0.01", clock=virtual_clock),
                            arm(HONEST, "--per-token", "0.01", clock=virtual_clock),
                            'rungs = ["8/8"]\nmin_speed_ratio = { e2e = 0.5 }', runs=4)
    assert len(calls) >= 16, calls  # the stalls happened
    assert code == 0 and data["verdict"] == "pass", out  # before: no clock to inject (AttributeError)
