"""docs/engine-protocol.md as a contract: what the page says the gate accepts, it accepts; what it
says it refuses, it refuses; and its minimal engine is a real file that behaves as the page says."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strict_gate.engines import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.command.replies import ReplyError, generate_record, scored_steps
from strict_gate.engines.eos import eos_token_ids
from strict_gate.errors import ConfigError
from strict_gate.runs.records import Sampling

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "engine-protocol.md"
MINIMAL = ROOT / "examples" / "engines" / "minimal_engine.py"
P1 = PromptInput(id="p1", token_ids=(1, 10, 11))


def _reply(**kw) -> dict:
    return {"id": "p1", "token_ids": [5, 6], "finish_reason": "length"} | kw


# ---------------------------------------------------------------- the minimal engine


def test_the_doc_prints_the_minimal_engine_file_verbatim():
    section = DOC.read_text(encoding="utf-8").split("## 8.", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert code == MINIMAL.read_text(encoding="utf-8")


def test_minimal_engine_speaks_the_protocol(tmp_path):
    eng = CommandEngine(CommandOptions(command=["python", str(MINIMAL)], timeout_s=10, eos_token_ids=[31]),
                        base_dir=tmp_path, env={"DEVICE_KDA": "1"})
    eng.log_path = tmp_path / "engine.log"
    try:
        eng.start()
        assert eng.hello["settings"] == {"DEVICE_KDA": True} and eng.can_score is False
        (r,) = eng.generate([P1], Sampling(max_tokens=4, top_logprobs=3))
        assert r.error is None and r.finish_reason == "length" and len(r.token_ids) == 4
        assert all(len(s) == 3 and s[0][0] == t for s, t in zip(r.top_logprobs, r.token_ids))
        (r0,) = eng.generate([P1], Sampling(max_tokens=2, top_logprobs=0))
        assert r0.top_logprobs is None and len(r0.token_ids) == 2
        stop = r.token_ids[1]  # told to stop on the second token: it stops there, with "stop"
        eng.eos_token_ids = (stop,)
        (rs,) = eng.generate([P1], Sampling(max_tokens=4, top_logprobs=1))
        assert rs.token_ids == r.token_ids[:2] and rs.finish_reason == "stop"
    finally:
        eng.close()


def _started(tmp_path):
    proc = subprocess.Popen([sys.executable, str(MINIMAL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    assert json.loads(proc.stdout.readline())["hello"] == "strict-gate/engine@1"
    return proc


def test_minimal_engine_exits_quietly_when_the_gate_closes_stdin(tmp_path):
    proc = _started(tmp_path)
    proc.stdin.close()  # the gate died between requests
    assert proc.wait(timeout=10) == 0
    assert proc.stderr.read() == b""


def test_minimal_engine_exits_quietly_when_the_gate_dies_mid_request(tmp_path):
    proc = _started(tmp_path)
    proc.stdout.close()  # the gate is gone: its end of the pipe closed...
    req = {"op": "generate", "id": "p", "prompt_token_ids": [1, 2], "max_tokens": 2, "top_logprobs": 1}
    proc.stdin.write((json.dumps(req) + "\n").encode())
    proc.stdin.close()  # ...after a last request whose answer now breaks the pipe
    assert proc.wait(timeout=10) == 0
    assert proc.stderr.read() == b""


def test_minimal_engine_answers_an_unknown_op_with_an_error_and_goes_on(tmp_path):
    proc = _started(tmp_path)
    proc.stdin.write(b'{"op": "score", "id": "s1", "prompt_token_ids": [1], "continuation_ids": [2], '
                     b'"top_logprobs": 1}\n')
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {"id": "s1", "error": "unsupported op 'score'"}
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


# ---------------------------------------------------------------- generate replies


@pytest.mark.parametrize("top", ["absent", None, []])
def test_no_logprobs_may_be_absent_null_or_empty_when_none_were_asked(top):
    reply = _reply() if top == "absent" else _reply(top_logprobs=top)
    rec = generate_record(reply, P1.token_ids, Sampling(max_tokens=2, top_logprobs=0), "p", None)
    assert rec.top_logprobs is None


def test_empty_top_logprobs_is_refused_when_logprobs_were_asked():
    with pytest.raises(ReplyError, match="steps-match-tokens|missing"):
        generate_record(_reply(top_logprobs=[]), P1.token_ids, Sampling(max_tokens=2, top_logprobs=2), "p", None)


def test_minus_infinity_pairs_are_read_as_not_listed():
    reply = json.loads('{"id": "p1", "token_ids": [5], "finish_reason": "length", '
                       '"top_logprobs": [[[5, -0.1], [7, -Infinity], [6, -2.0]]]}')
    rec = generate_record(reply, P1.token_ids, Sampling(max_tokens=1, top_logprobs=3), "p", None)
    assert rec.top_logprobs[0] == ((5, -0.1), (6, -2.0))


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "null", "0.5"])
def test_nan_plus_infinity_null_and_positive_logprobs_are_refused(bad):
    reply = json.loads('{"id": "p1", "token_ids": [5], "finish_reason": "length", '
                       f'"top_logprobs": [[[5, -0.1], [6, {bad}]]]}}')
    with pytest.raises(ReplyError):
        generate_record(reply, P1.token_ids, Sampling(max_tokens=1, top_logprobs=2), "p", None)


def test_a_logprob_a_hair_above_zero_is_float_noise():
    rec = generate_record(_reply(token_ids=[5], top_logprobs=[[[5, 5e-7]]]), P1.token_ids,
                          Sampling(max_tokens=1, top_logprobs=1), "p", None)
    assert rec.top_logprobs[0][0] == (5, 5e-7)
    with pytest.raises(ReplyError, match="finite-logprobs"):
        generate_record(_reply(token_ids=[5], top_logprobs=[[[5, 2e-6]]]), P1.token_ids,
                        Sampling(max_tokens=1, top_logprobs=1), "p", None)


def test_more_than_k_plus_one_pairs_is_refused_even_for_k_zero():
    with pytest.raises(ReplyError, match="at most k \\+ 1"):
        generate_record(_reply(token_ids=[5], top_logprobs=[[[5, -0.1], [6, -1.0]]]), P1.token_ids,
                        Sampling(max_tokens=1, top_logprobs=0), "p", None)


def test_exact_tie_any_order_is_sorted_by_token_id():
    rec = generate_record(_reply(token_ids=[9], top_logprobs=[[[9, -0.5], [4, -0.5]]]), P1.token_ids,
                          Sampling(max_tokens=1, top_logprobs=2), "p", None)
    assert rec.top_logprobs[0] == ((4, -0.5), (9, -0.5))  # the gate sorts; choosing 9 is still greedy


def test_stop_must_end_on_one_of_the_eos_ids_sent():
    s = Sampling(max_tokens=4, top_logprobs=0)
    assert generate_record(_reply(finish_reason="stop", token_ids=[5, 2]), P1.token_ids, s, "p", (2, 3)).token_ids
    with pytest.raises(ReplyError, match="eos_token_ids"):
        generate_record(_reply(finish_reason="stop", token_ids=[5, 6]), P1.token_ids, s, "p", (2, 3))


# ---------------------------------------------------------------- score replies


def _steps(*steps) -> dict:
    return {"id": "score-1", "steps": list(steps)}


def test_score_top_may_omit_the_scored_token_and_minus_infinity_means_masked():
    (s,) = scored_steps(json.loads('{"steps": [{"token_id": 7, "logprob": -Infinity, "top": [[3, -0.1]]}]}'), [7], 1)
    assert s.logprob is None and s.argmax == 3 and s.top == ((3, -0.1),)


def test_score_top_must_hold_the_argmax():
    with pytest.raises(ReplyError, match="non-empty"):
        scored_steps(_steps({"token_id": 7, "logprob": -0.1, "top": []}), [7], 1)


def test_score_top_at_most_k_plus_one_and_no_duplicates():
    with pytest.raises(ReplyError, match="at most k \\+ 1"):
        scored_steps(_steps({"token_id": 7, "logprob": -2.0, "top": [[3, -0.1], [4, -0.2], [7, -2.0]]}), [7], 1)
    with pytest.raises(ReplyError, match="twice"):
        scored_steps(_steps({"token_id": 7, "logprob": -0.1, "top": [[7, -0.1], [7, -0.1]]}), [7], 2)


@pytest.mark.parametrize("lp", [float("nan"), math.inf, 0.5, "x"])
def test_score_logprob_must_be_a_logprob(lp):
    with pytest.raises(ReplyError, match="logprob"):
        scored_steps(_steps({"token_id": 7, "logprob": lp, "top": [[7, -0.1]]}), [7], 1)


def test_score_with_zero_top_logprobs_asks_for_one(tmp_path):
    """top_logprobs 0 in the gate still needs each score step's argmax: the request says 1."""
    seen = tmp_path / "seen.jsonl"
    script = tmp_path / "echo_score.py"
    script.write_text(
        "import json, sys\n"
        "print(json.dumps({'hello': 'strict-gate/engine@1', 'capabilities': ['generate', 'score']}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    req = json.loads(line)\n"
        "    if req['op'] == 'shutdown': break\n"
        f"    open({str(seen)!r}, 'a').write(line)\n"
        "    print(json.dumps({'id': req['id'], 'steps': [{'token_id': t, 'logprob': -0.1, 'top': [[t, -0.1]]}\n"
        "          for t in req['continuation_ids']]}), flush=True)\n"
    )
    eng = CommandEngine(CommandOptions(command=["python", str(script)], timeout_s=10), base_dir=tmp_path)
    eng.log_path = tmp_path / "engine.log"
    try:
        assert eng.score([1, 2], [], 0) == []  # an empty continuation is never sent
        assert not seen.exists()
        (s,) = eng.score([1, 2], [3], 0)
        assert s.argmax == 3 and json.loads(seen.read_text())["top_logprobs"] == 1
    finally:
        eng.close()


# ---------------------------------------------------------------- eos ids and the command line


def test_eos_ids_from_generation_config_and_tokenizer(tmp_path):
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps({"added_tokens": [{"id": 7, "content": "<|end|>"}], "model": {"vocab": {}}}))
    assert eos_token_ids(tok) is None
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert eos_token_ids(tok) == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 4]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    assert eos_token_ids(tok) == (3, 4, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "eos"}))
    with pytest.raises(ConfigError, match="set eos_token_ids"):
        eos_token_ids(tok)


def test_eos_ids_reach_the_generate_request(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    eng = CommandEngine(CommandOptions(command=["python", "x.py"], tokenizer="model"), base_dir=tmp_path)
    assert eng.eos_token_ids == (2, 5)
    eng = CommandEngine(CommandOptions(command=["python", "x.py"], tokenizer="model", eos_token_ids=[9]),
                        base_dir=tmp_path)
    assert eng.eos_token_ids == (9,)


def test_bare_python_is_the_gates_interpreter_and_a_venv_path_keeps_its_symlink(tmp_path):
    assert CommandEngine(CommandOptions(command=["python", "x.py"]), base_dir=tmp_path).argv[0] == sys.executable
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    os.symlink(sys.executable, venv_bin / "python")
    eng = CommandEngine(CommandOptions(command=["venv/bin/python", "x.py"]), base_dir=tmp_path)
    # resolving the symlink would run the base interpreter, outside the engine's venv
    assert eng.argv[0] == str(venv_bin / "python")


def test_a_live_engine_writing_minus_infinity_is_accepted_and_the_pair_dropped(tmp_path):
    fake = Path(__file__).resolve().parent / "engines" / "fake_engine.py"
    canned = tmp_path / "canned.jsonl"
    canned.write_text('{"id": "x", "token_ids": [5], "finish_reason": "length", '
                      '"top_logprobs": [[[5, -0.1], [7, -Infinity]]]}\n')
    eng = CommandEngine(CommandOptions(command=["python", str(fake), "--canned", str(canned)], timeout_s=10),
                        base_dir=tmp_path)
    eng.log_path = tmp_path / "engine.log"
    try:
        (r,) = eng.generate([P1], Sampling(max_tokens=1, top_logprobs=2))
        assert r.top_logprobs[0] == ((5, -0.1),)
    finally:
        eng.close()
