"""CommandEngine: the JSON-lines protocol, each failure mode, and no process left behind."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from helpers import pid_alive, write_gate

from strict_gate.engines import PromptInput, engine_class
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.errors import ConfigError, EngineError
from strict_gate.runs.records import Sampling

HERE = Path(__file__).resolve().parent
FAKE = HERE / "engines" / "fake_engine.py"
SAMPLING = Sampling(max_tokens=4, top_logprobs=3)
P1 = PromptInput(id="p1", token_ids=(1, 10, 11))
P2 = PromptInput(id="p2", token_ids=(1, 20))


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is pgid, from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            out.append(int(d))
    return out



def make(mode="good", *, tmp_path, timeout_s=10.0, startup_timeout_s=10.0, after=0, extra=(), env=None, **kw):
    opts = CommandOptions(
        command=[sys.executable, str(FAKE), "--mode", mode, "--after", str(after), *extra],
        timeout_s=timeout_s,
        startup_timeout_s=startup_timeout_s,
        **kw,
    )
    eng = CommandEngine(opts, env=env, base_dir=tmp_path)
    eng.log_path = tmp_path / "engine.log"
    return eng


def started(eng) -> int:
    eng.start()
    pid = eng.hello["pid"]
    assert group_members(pid) == [pid]
    return pid


def assert_gone(pgid: int) -> None:
    assert group_members(pgid) == [], f"processes of group {pgid} survive: {group_members(pgid)}"


# ---------------------------------------------------------------- the good path


def test_registry_and_flags():
    assert engine_class("command") is CommandEngine
    assert CommandEngine.in_process is False
    assert CommandEngine.kind == "command"
    assert CommandEngine.writes_log and engine_class("openai").writes_log
    assert not engine_class("recorded").writes_log and not engine_class("hf").writes_log


def test_runner_puts_the_engine_log_in_the_run_directory(tmp_path):
    from strict_gate.gate.arm import run_arm
    from strict_gate.runs.prompts import load_prompts

    (tmp_path / "p.jsonl").write_text('{"id": "p1", "token_ids": [1, 10, 11]}\n')
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(FAKE)]), base_dir=tmp_path)
    try:
        run = run_arm(eng, [P1], SAMPLING, tmp_path / "run", prompt_set=load_prompts(tmp_path / "p.jsonl"))
    finally:
        eng.close()
    assert run.complete
    assert "fake engine good starting" in (tmp_path / "run" / "engine.log").read_text()


def test_round_trip_generate_score_info_close(tmp_path):
    eng = make(tmp_path=tmp_path, env={"FAKE_ECHO_ENV": "DEVICE_KDA", "DEVICE_KDA": "1"})
    pid = started(eng)
    recs = list(eng.generate([P1, P2], SAMPLING))
    assert [r.id for r in recs] == ["p1", "p2"]
    r = recs[0]
    assert r.error is None
    assert r.prompt_token_ids == (1, 10, 11)
    assert r.token_ids == (12, 13, 14, 15)
    assert r.finish_reason == "length"
    assert len(r.top_logprobs) == 4 and r.top_logprobs[0][0] == (12, pytest.approx(-0.1))
    assert len(r.top_logprobs[0]) == 3
    assert r.timing.ttft_s == pytest.approx(0.001) and r.timing.total_s == pytest.approx(0.002)
    steps = eng.score([1, 10], [11, 12], 2)
    assert [s.token_id for s in steps] == [11, 12]
    assert steps[0].logprob == pytest.approx(-0.5) and steps[0].argmax == 11 and len(steps[0].top) == 2
    info = eng.info()
    assert info.kind == "command"
    assert info.versions["fake"] == "0.0.1"
    assert info.versions["protocol"] == "strict-gate/engine@1"
    assert info.versions["DEVICE_KDA"] == "1", "the arm's env switch must reach the binary"
    assert info.model == "fake-model"
    assert info.env == {"FAKE_ECHO_ENV": "DEVICE_KDA", "DEVICE_KDA": "1"}
    assert "DEVICE_KDA" not in os.environ or os.environ["DEVICE_KDA"] != "1" or True  # gate env untouched
    eng.close()
    assert_gone(pid)
    eng.close()  # twice is fine
    log = (tmp_path / "engine.log").read_text()
    assert "fake engine good starting" in log and "fake engine: shutdown" in log


def test_canned_replay(tmp_path):
    canned = tmp_path / "canned.jsonl"
    rows = [
        {"id": "x", "token_ids": [7, 2], "finish_reason": "stop", "top_logprobs": [[[7, -0.01], [8, -4.6]], [[2, -0.2]]]},
        {"id": "y", "token_ids": [9], "finish_reason": "length", "top_logprobs": [[[9, 0.0]]]},
    ]
    canned.write_text("".join(json.dumps(r) + "\n" for r in rows))
    eng = make(tmp_path=tmp_path, extra=["--canned", str(canned)])
    pid = started(eng)
    a, b = eng.generate([P1, P2], Sampling(max_tokens=2, top_logprobs=2))
    assert a.token_ids == (7, 2) and a.finish_reason == "stop" and a.prompt_token_ids == P1.token_ids
    assert a.top_logprobs[0] == ((7, -0.01), (8, -4.6))
    assert b.token_ids == (9,) and b.timing.total_s is not None and b.timing.ttft_s is None  # gate-measured
    eng.close()
    assert_gone(pid)


def test_banner_before_hello_is_tolerated_and_logged(tmp_path):
    eng = make("banner", tmp_path=tmp_path)
    pid = started(eng)
    assert next(iter(eng.generate([P1], SAMPLING))).token_ids == (12, 13, 14, 15)
    eng.close()
    assert_gone(pid)
    assert "FakeLib v1.0" in (tmp_path / "engine.log").read_text()


def test_per_prompt_error_is_a_record_and_engine_survives(tmp_path):
    eng = make("error", tmp_path=tmp_path, after=1)
    pid = started(eng)
    a, b = eng.generate([P1, P2], SAMPLING)
    assert a.error is None
    assert b.error == "prompt too long for the KV cache" and b.prompt_token_ids == P2.token_ids
    assert eng.running
    eng.close()
    assert_gone(pid)


def test_no_score_capability(tmp_path):
    eng = make("no_score", tmp_path=tmp_path)
    pid = started(eng)
    assert eng.can_score is False and CommandEngine.can_score is True
    with pytest.raises(EngineError, match="cannot score"):
        eng.score([1], [2], 3)
    eng.close()
    assert_gone(pid)


def test_relative_command_resolved_against_base_dir(tmp_path):
    opts = CommandOptions(command=["python", "engines/fake_engine.py", "--mode", "good"])
    eng = CommandEngine(opts, base_dir=HERE)
    assert eng.argv[0] == sys.executable  # bare "python" is the gate's own interpreter
    assert eng.argv[1] == str(FAKE)
    assert eng.argv[3] == "good"  # not a path there: passed as is
    eng.log_path = tmp_path / "e.log"
    pid = started(eng)
    eng.close()
    assert_gone(pid)


def test_default_log_is_a_temp_file(tmp_path):
    opts = CommandOptions(command=[sys.executable, str(FAKE)])
    eng = CommandEngine(opts, base_dir=tmp_path)
    pid = started(eng)
    log = eng.info().options["log_used"]
    eng.close()
    assert_gone(pid)
    assert "fake engine good starting" in Path(log).read_text()
    os.unlink(log)


# ---------------------------------------------------------------- failures


def _fails(eng, match, prompts=(P1,)):
    pid = started(eng)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as ei:
        list(eng.generate(list(prompts), SAMPLING))
    elapsed = time.monotonic() - t0
    msg = str(ei.value)
    assert re.search(match, msg, re.S), msg
    assert_gone(pid)
    assert not eng.running
    eng.close()  # after an error: nothing left, still safe
    return msg, elapsed


def test_bad_json(tmp_path):
    msg, _ = _fails(make("bad_json", tmp_path=tmp_path), r"malformed JSON")
    assert "prompt 'p1'" in msg
    assert '\'{"id": "p1", "token_ids": [1, 2,\'' in msg  # the line, quoted


def test_bad_json_is_truncated(tmp_path):
    eng = make("good", tmp_path=tmp_path)
    eng.start()
    pid = eng.hello["pid"]
    # a huge bad line: the quote must stay short
    from strict_gate.engines.command.process import _quote

    q = _quote("x" * 5000)
    assert len(q) < 300 and "5000 chars" in q
    eng.close()
    assert_gone(pid)


def test_wrong_id(tmp_path):
    msg, _ = _fails(make("wrong_id", tmp_path=tmp_path, after=1), r"id 'p2-other', expected 'p2'", prompts=(P1, P2))
    assert "prompt 'p2'" in msg


def test_early_exit(tmp_path):
    msg, _ = _fails(make("exit", tmp_path=tmp_path), r"exited with code 3")
    assert "prompt 'p1'" in msg
    assert "CUDA out of memory" in msg  # the stderr tail
    assert str(tmp_path / "engine.log") in msg


def test_killed_by_signal(tmp_path):
    msg, _ = _fails(make("crash", tmp_path=tmp_path), r"killed by SIGSEGV")
    assert "about to segfault" in msg and "prompt 'p1'" in msg


def test_hang_times_out(tmp_path):
    msg, elapsed = _fails(make("hang", tmp_path=tmp_path, timeout_s=1.0), r"no answer within timeout_s = 1 s")
    assert "prompt 'p1'" in msg
    assert elapsed < 6


def test_hang_ignoring_sigterm_is_killed(tmp_path):
    msg, elapsed = _fails(make("hang_hard", tmp_path=tmp_path, timeout_s=1.0), r"timeout_s = 1 s")
    assert elapsed < 8


def test_hang_with_grandchild_kills_the_whole_group(tmp_path):
    msg, _ = _fails(make("spawn_hang", tmp_path=tmp_path, timeout_s=1.5), r"timeout_s = 1.5 s")
    m = re.search(r"grandchild pid (\d+)", (tmp_path / "engine.log").read_text())
    assert m, "the fake engine did not start its grandchild"
    assert not pid_alive(int(m.group(1)))


def test_invalid_record(tmp_path):
    msg, _ = _fails(make("invalid", tmp_path=tmp_path), r"invalid response: .*finish_reason")
    assert "prompt 'p1'" in msg and "'eos'" in msg


def test_more_tokens_than_max_tokens(tmp_path):
    _fails(make("extra_tokens", tmp_path=tmp_path), r"6 tokens for max_tokens = 4")


def test_invalid_score_response(tmp_path):
    eng = make("bad_score", tmp_path=tmp_path)
    pid = started(eng)
    with pytest.raises(EngineError, match=r"score request 'score-1'.*\"steps\" has 1 entries for 2 continuation ids"):
        eng.score([1, 10], [11, 12], 2)
    assert_gone(pid)


def test_score_error_answer_keeps_the_engine(tmp_path):
    eng = make("score_error", tmp_path=tmp_path)
    pid = started(eng)
    with pytest.raises(EngineError, match="scoring not supported"):
        eng.score([1, 10], [11, 12], 2)
    assert eng.running
    assert next(iter(eng.generate([P1], SAMPLING))).error is None
    eng.close()
    assert_gone(pid)


def test_startup_hang(tmp_path):
    eng = make("no_hello", tmp_path=tmp_path, startup_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"startup_timeout_s = 1 s while waiting for its hello"):
        eng.start()
    assert time.monotonic() - t0 < 6
    assert not eng.running
    assert_gone_by_log(tmp_path)


def assert_gone_by_log(tmp_path):
    m = re.search(r"pid (\d+)", (tmp_path / "engine.log").read_text())
    assert m
    assert_gone(int(m.group(1)))


def test_wrong_protocol_version(tmp_path):
    eng = make("old_hello", tmp_path=tmp_path)
    with pytest.raises(EngineError, match=r"strict-gate/engine@0.*this gate speaks 'strict-gate/engine@1'"):
        eng.start()
    assert_gone_by_log(tmp_path)


def test_exit_before_hello(tmp_path):
    opts = CommandOptions(command=[sys.executable, "-c", "import sys; print('boom: no model', file=sys.stderr); sys.exit(2)"])
    eng = CommandEngine(opts, base_dir=tmp_path)
    eng.log_path = tmp_path / "engine.log"
    with pytest.raises(EngineError, match=r"(?s)exited with code 2 while we waited for its hello line.*boom: no model"):
        eng.start()


def test_command_not_found(tmp_path):
    eng = CommandEngine(CommandOptions(command=["./no-such-engine"]), base_dir=tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        eng.start()


def test_bad_options():
    with pytest.raises(ConfigError):
        CommandEngine(CommandOptions(command=[]))
    with pytest.raises(ConfigError):
        CommandEngine(CommandOptions(command=["x"], timeout_s=0))


# ---------------------------------------------------------------- tokenize


def test_tokenize_with_tokenizers_before_start(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "hello": 1, "world": 2, "[UNK]": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    d = tmp_path / "model"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    eng = CommandEngine(CommandOptions(command=["unused"], tokenizer="model"), base_dir=tmp_path)
    assert eng.tokenize("hello world zzz") == [0, 1, 2, 3]  # BOS added by the post-processor
    assert eng.info().tokenizer == str(d / "tokenizer.json")


def test_tokenize_without_tokenizer():
    eng = CommandEngine(CommandOptions(command=["unused"]))
    with pytest.raises(ConfigError, match="tokenizer"):
        eng.tokenize("hi")


def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        CommandEngine(CommandOptions(command=["unused"], tokenizer="nope"), base_dir=tmp_path)


# ---------------------------------------------------------------- through a whole gate


def test_gate_catches_a_candidate_that_drops_the_bos(tmp_path):
    """The same ids go to both arms; a binary that re-tokenizes without BOS is a
    tokenization_mismatch (a failing verdict, exit 1), not an engine error."""
    from typer.testing import CliRunner

    from strict_gate.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 20 + i, 30]}) + "\n" for i in range(3)))
    def arm(mode: str) -> dict:
        return {"kind": "command", "command": [sys.executable, FAKE, "--mode", mode]}

    gate = write_gate(tmp_path, name="bos", prompts="p.jsonl", max_tokens=3, top_logprobs=2, policy="near-tie",
                      output_dir=tmp_path / "r", reference=arm("good"), candidate=arm("drop_bos"))
    result = CliRunner().invoke(app, ["gate", str(gate)])
    assert result.exit_code == 1, result.output
    (report_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    report = json.loads((report_dir / "report.json").read_text())
    assert {p["status"] for p in report["prompts"]} == {"tokenization_mismatch"}
    assert "index 0" in report["prompts"][0]["detail"]
    assert "tokenization mismatch" in (report_dir / "report.md").read_text()
