"""One continuation judge (issue 49, item 4): what follows a flip is judged by the gate's cascade
rule (judge/cascade.py) in every arm that meets one, and a stopped or shorter output after a flip
leaves positions unjudged: never a pass.

Hostile engines are real processes (tests/engines/): variant_engine.py flips a near-tie when
requests share a batch and then stops; hostile_speed_engine.py flips only on the speed arm's
timed requests, then emits garbage or stops; the fake OpenAI server's text-only mode flips a
near-tie of the committed baseline and stops there. Each gate runs as a user runs it: from its
own directory, relative paths, `strict-gate gate gate.toml`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from engines.fake_openai_server import Mode
from helpers import section, write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

ROOT = Path(__file__).resolve().parents[1]
ENGINES = Path(__file__).parent / "engines"
BASELINE = ROOT / "baselines" / "tiny-llama-vllm-fp32"
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
runner = CliRunner()


def _gate(*args: str) -> tuple[int, str, dict]:
    """`strict-gate gate gate.toml` in the working directory, and its report.json."""
    result = runner.invoke(app, ["gate", "gate.toml", *args], terminal_width=200)
    assert list(Path("out").glob("*/report.json")), result.output
    (report,) = Path("out").glob("*/report.json")
    return result.exit_code, result.output, json.loads(report.read_text())


# ---------------------------------------------------------------------------- invariance


def _invariance_gate(tmp_path: Path, monkeypatch, *flags: str) -> None:
    """Both arms agree at batch 1; the candidate's batch-4 variant flips a 0.1-nat near-tie at
    position 2 (band 0.5) and then does what `flags` say."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINES / "variant_engine.py", "variant_engine.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7]}) + "\n"
                                       for i in range(4)))
    write_gate(Path("."), name="cont", prompts="p.jsonl", max_tokens=8, top_logprobs=2, policy="strict", band=0.5,
               output_dir="out", reference={"kind": "command", "command": ["python", "variant_engine.py"]},
               candidate={"kind": "command", "command": ["python", "variant_engine.py", "--mode", "in_flight",
                                                         "--gap", "0.1", *flags]},
               invariance={"batch": [4], "policy": "near-tie"})


@pytest.mark.parametrize(("flags", "stopped"), [
    (("--stop", "2"), "stopped after 3 of 8 tokens"),  # on the flip itself: nothing after it was re-scored
    (("--stop", "3", "--score"), "stopped after 4 of 8 tokens"),  # one later token judged, then the stop
])
def test_a_batch_variant_that_flips_then_stops_is_never_invariant(tmp_path, monkeypatch, flags, stopped):
    """The variant flips a near-tie and stops (finish "stop", an ordinary token, no end-of-sequence
    id) where the batch-1 run went on to 8 tokens: the positions it never emitted are unjudged, as
    the gate's own cascade rule says of a candidate, so the variant is incomplete: exit 3."""
    _invariance_gate(tmp_path, monkeypatch, *flags)
    code, out, report = _gate()
    assert code == 3, out  # before: INVARIANT, exit 0
    assert report["verdict"] == "pass"  # the arms agree at batch 1
    (variant,) = section(report, "invariance")["variants"]
    assert variant["verdict"] == "incomplete"
    assert any(stopped in p and "where the batch-1 run may have gone on" in p for p in variant["problems"]), \
        variant["problems"]
    assert "INVARIANT," not in out.replace("NOT INVARIANT", "")


# ---------------------------------------------------------------------------- speed


def _speed_gate(tmp_path: Path, monkeypatch, reference: str, candidate: str, speed: dict) -> None:
    """Two arms of hostile_speed_engine.py whose gate requests are honest (the token verdict
    passes); `reference` and `candidate` are their tricks on the timed requests."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINES / "hostile_speed_engine.py", "engine.py")
    shutil.copy(ENGINES / "virtual_time.py", "virtual_time.py")  # the module the engine imports beside it
    Path("two.jsonl").write_text("\n".join((ROOT / "prompts" / "smoke.jsonl").read_text().splitlines()[:2]) + "\n")

    def arm(trick: str) -> dict:
        return {"kind": "command", "command": ["python", "engine.py", "--trick", trick, "--per-token", "0.01"],
                "tokenizer": "bundled:tiny-llama"}

    write_gate(Path("."), name="cont", prompts="two.jsonl", max_tokens=4, policy="strict", output_dir="out",
               reference=arm(reference), candidate=arm(candidate), speed={"warmup": 0, "runs": 1} | speed)


@pytest.mark.parametrize("speed", [{"rungs": ["8/8"]}, {"rungs": ["8/8"], "min_speed_ratio": {"e2e": 0.1}}],
                         ids=["no-bar", "bar"])
def test_a_flip_on_timed_requests_then_garbage_fails_the_gate(tmp_path, monkeypatch, speed):
    """The candidate answers the gate's own requests honestly; on the timed ones it flips a
    0.01-nat near-tie at position 1, then emits zeros the model ranks nowhere. Timed tokens that
    do not verify fail the gate, exit 1, bar or no bar."""
    _speed_gate(tmp_path, monkeypatch, "tie", "tie-garbage", speed)
    code, out, report = _gate()
    assert code == 1, out  # before: exit 0 without a bar (informational), 4 with one (not comparable)
    assert report["verdict"] == "pass"  # the gate's own tokens
    assert section(report, "speed")["verdict"] == "tokens_not_verified"
    reasons = section(report, "speed")["speed_verdict"]["reasons"]
    assert reasons[0].startswith("timed tokens not verified: rung 8/8:") and "near_tie at position 1" in reasons[0]
    said = " ".join(out.split())
    assert "speed: tokens not verified" in said and "timed tokens: not verified on rung 8/8" in said


def test_a_flip_on_timed_requests_then_a_stop_is_not_verified(tmp_path, monkeypatch):
    """On the timed requests the candidate flips the near-tie at position 1, then emits the EOS
    and stops (told to ignore it), where the reference's reply went on to 8 tokens: what follows
    the flip is unjudged (the speed arm does not re-score), so its timed tokens do not verify
    (exit 1), and no format words them "all verified"."""
    rung = "8/8"
    _speed_gate(tmp_path, monkeypatch, "tie", "tie-stop", {"rungs": [rung]})
    code, out, report = _gate()
    assert code == 1, out  # before: exit 0, "timed tokens: ... all verified"
    (checked,) = section(report, "speed")["rungs"]
    assert checked["token_check"]["verified"] is False
    problem = checked["token_check"]["problems"][0]
    assert "near_tie at position 1" in problem and "after the flip not judged" in problem, problem
    (report_dir,) = (p.parent for p in Path("out").glob("*/report.json"))
    shown = runner.invoke(app, ["show", str(report_dir)], terminal_width=200).output
    for words in (out, shown, *(p.read_text() for p in Path("out").glob("*/report.md"))):
        assert "all verified" not in words and f"timed tokens: not verified on rung {rung}" in " ".join(words.split())


def test_timed_tokens_that_agree_still_pass_without_a_bar(tmp_path, monkeypatch):
    """The control: the same tie on both arms, neither flips it: verified, informational, exit 0."""
    _speed_gate(tmp_path, monkeypatch, "tie", "tie", {"rungs": ["8/8"]})
    code, out, report = _gate()
    assert code == 0, out
    assert section(report, "speed")["verdict"] == "informational" and "all verified" in " ".join(out.split())


# ---------------------------------------------------------------------------- text-only


def test_a_text_only_flip_then_a_stop_is_never_a_pass(tmp_path, monkeypatch, fake_openai):
    """prose-001's baseline has a 0.024-nat near-tie at position 5 (352 over 202). A text-only
    server answers its text with 202 there and stops (finish "stop", no EOS): the one-sided flip
    is within the band and nothing follows it, but the 10 positions it never generated are
    unjudged (cascade.stop_problem, as for any candidate): unverified, exit 3."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "prompts" / "battery-128.jsonl", "prompts.jsonl")
    shutil.copytree(BASELINE, "baseline")
    Path("tokenizer").mkdir()
    shutil.copy(MODEL / "tokenizer.json", "tokenizer/tokenizer.json")
    srv = fake_openai(Mode.TEXT_ONLY, tokenizer=MODEL / "tokenizer.json", replay=BASELINE / "records.jsonl",
                      tokenize=True, flip_stop=(5, 352, 202))
    write_gate(Path("."), name="text-only", prompts="prompts.jsonl", max_tokens=16, top_logprobs=5,
               policy="near-tie-reference-only", band=0.5, output_dir="out",
               reference={"kind": "recorded", "path": "baseline", "model": "bundled:tiny-llama"},
               candidate={"kind": "openai", "base_url": srv.url, "text_only": True, "tokenizer": "tokenizer",
                          "retries": 0},
               rescorer={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"})
    code, out, report = _gate()
    assert code == 3, out
    flipped = [p for p in report["prompts"] if not p["passed"]]
    assert [p["id"] for p in flipped] == ["prose-001"]
    (p,) = flipped
    assert p["outcome"] == "unverified", p
    assert "one-sided near-tie at position 5" in p["reason"] and "stopped after 6 of 16 tokens" in p["reason"]
