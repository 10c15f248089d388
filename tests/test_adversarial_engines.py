"""Hostile engines, servers and inputs (issue 16, items 11, 12, 17, 18, 19).

Every server here is a real `http.server` on 127.0.0.1, started and stopped by the test; every
command engine a real process (tests/engines/hostile_engine.py, tests/engines/fake_engine.py);
the SIGKILL tests kill a real `strict-gate gate` subprocess with SIGKILL. No mocks.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import pid_alive
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.core.engine_log import LOG_HEAD_BYTES, LOG_TAIL_BYTES, engine_log
from strict_gate.engines.base import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.openai.engine import OpenAIEngine, OpenAIOptions
from strict_gate.errors import ConfigError, EngineError
from strict_gate.gate.config import parse_gate_config
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.records import Sampling

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "engines" / "hostile_engine.py"
FAKE = ROOT / "tests" / "engines" / "fake_engine.py"
FAKE_SERVER = ROOT / "tests" / "engines" / "fake_openai_server.py"
SAMPLING = Sampling(max_tokens=2, top_logprobs=2)
P0 = PromptInput("p0", (1, 5, 9))


# ---------------------------------------------------------------------------- hostile HTTP servers
def _completion(body: dict) -> dict:
    """A vLLM-like answer: token i is prompt[-1] + i + 1, as ids."""
    gen = [body["prompt"][-1] + i + 1 for i in range(body["max_tokens"])]
    k = body.get("logprobs") or 1
    return {"choices": [{
        "index": 0, "text": "", "finish_reason": "length", "token_ids": gen, "prompt_token_ids": body["prompt"],
        "logprobs": {"tokens": [f"token_id:{t}" for t in gen], "token_logprobs": [-0.1] * len(gen),
                     "top_logprobs": [{f"token_id:{t + j}": -0.1 - j for j in range(k)} for t in gen]},
    }]}


def _models(max_model_len: int | None = None):
    entry = {"id": "m"} | ({"max_model_len": max_model_len} if max_model_len else {})
    return lambda h: h.send_json(200, {"object": "list", "data": [entry]})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, code: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def _route(self, method: str) -> None:
        self.server.seen.append((method, self.path, dict(self.headers)))
        route = self.server.routes.get((method, self.path))
        if route is None:
            self.send_json(404, {"error": {"message": "not found"}})
        else:
            try:
                route(self)
            except (BrokenPipeError, ConnectionResetError):  # the client hung up: what a deadline does
                pass

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")


@pytest.fixture
def http():
    """http(routes) -> (base url, requests seen): a server on 127.0.0.1, stopped after the test."""
    servers = []

    def make(routes: dict):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        srv.daemon_threads = True
        srv.routes, srv.seen = routes, []
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", srv.seen

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _openai(url: str, **kw) -> OpenAIEngine:
    return OpenAIEngine(OpenAIOptions(base_url=url, model="m", retries=0, request_timeout_s=10.0, **kw))


# ---------------------------------------------------------------------------- 11: redirects, keys in URLs
def _redirect(code: int, location: str):
    def answer(h: _Handler) -> None:
        if h.command == "POST":
            h.body()
        h.send_response(code)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return answer


@pytest.mark.parametrize("method, path, code", [
    ("POST", "/v1/completions", 302),  # urllib would follow it as a GET, Authorization and all
    ("POST", "/v1/completions", 307),
    ("GET", "/v1/models", 301),  # the connect check
])
def test_a_redirect_to_another_origin_is_refused_and_the_key_stays_home(http, monkeypatch, method, path, code):
    key = "sk-test-" + secrets.token_hex(8)
    monkeypatch.setenv("SG_ADV_KEY", key)
    other, other_seen = http({})
    routes = {("GET", "/v1/models"): _models(), ("POST", "/v1/completions"): lambda h: h.send_json(200, _completion(h.body()))}
    routes[(method, path)] = _redirect(code, other + path)
    url, seen = http(routes)
    eng = OpenAIEngine(OpenAIOptions(base_url=url, api_key_env="SG_ADV_KEY", retries=0, request_timeout_s=10.0))
    try:
        with pytest.raises(EngineError, match=f"HTTP {code}, a redirect to '{other}{path}'"):
            list(eng.generate([P0], SAMPLING))
    finally:
        eng.close()
    assert other_seen == []  # nothing reached the other origin: no key, no POST turned GET
    assert seen and seen[-1][2].get("Authorization") == f"Bearer {key}"  # the key went to base_url only


@pytest.mark.parametrize("base_url", ["http://user:{key}@127.0.0.1:9", "http://127.0.0.1:9/v1?api_key={key}"])
def test_a_key_in_base_url_is_refused_at_load_and_never_shown(tmp_path, base_url):
    key = "sk-test-" + secrets.token_hex(8)
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "token_ids": [1, 2]}\n')
    (tmp_path / "gate.toml").write_text(
        f'name = "k"\nprompts = "p.jsonl"\noutput_dir = "{tmp_path / "r"}"\n'
        f'[reference]\nkind = "command"\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        f'[candidate]\nkind = "openai"\nmodel = "m"\nbase_url = "{base_url.format(key=key)}"\n'
    )
    result = CliRunner().invoke(app, ["gate", str(tmp_path / "gate.toml")])
    assert result.exit_code == 2, result.output
    assert "gate.toml:10: [candidate] openai: base_url" in result.output and "api_key_env" in result.output
    assert key not in result.output
    assert not (tmp_path / "r").exists()  # refused before anything was written


# ---------------------------------------------------------------------------- 17: the request deadline
def _trickle(h: _Handler, data: bytes) -> None:
    for i in range(len(data)):
        h.wfile.write(data[i : i + 1])
        h.wfile.flush()
        time.sleep(0.1)


def _trickling(where: str):
    """A completion whose headers, body or stream arrive one byte every 0.1 s, for about 15 s:
    a per-read timeout never fires."""
    def answer(h: _Handler) -> None:
        body = h.body()
        data = json.dumps(_completion(body)).encode()
        if where == "headers":
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\nX-Pad: {'a' * 120}\r\n\r\n".encode()
            _trickle(h, head)
            h.wfile.write(data)
        elif where == "body":
            data += b" " * 150  # JSON allows trailing whitespace
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            _trickle(h, data)
        else:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Connection", "close")
            h.end_headers()
            h.close_connection = True
            _trickle(h, b": keep-alive\n" * 12)  # SSE comments
            h.wfile.write(b"data: " + data + b"\n\ndata: [DONE]\n\n")
    return answer


@pytest.mark.parametrize("where", ["headers", "body", "stream"])
def test_a_trickling_server_is_cut_at_the_request_deadline(http, where):
    url, _ = http({("GET", "/v1/models"): _models(), ("POST", "/v1/completions"): _trickling(where)})
    eng = OpenAIEngine(OpenAIOptions(base_url=url, model="m", retries=0, request_timeout_s=1.5,
                                     stream_timing=where == "stream"))
    with pytest.raises(EngineError, match=r"prompt 'p0': no complete answer within 1.5 s \(a deadline on the whole"):
        list(eng.generate([P0], SAMPLING))


# ---------------------------------------------------------------------------- 12: a SIGKILLed gate

def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def reap(tmp_path):
    """Whatever a failing test left running (its gates, the pids its engines wrote) is killed afterwards."""
    gates: list[subprocess.Popen] = []
    yield gates
    for gate in gates:
        if gate.poll() is None:
            gate.kill()
            gate.communicate()
    for pidfile in tmp_path.glob("*.pid"):
        for pid in map(int, pidfile.read_text().split()):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _gate(tmp_path: Path, candidate: str, prompts: str = "", reference: str = "") -> subprocess.Popen:
    (tmp_path / "p.jsonl").write_text(prompts or "".join(
        json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n" for i in range(3)))
    reference = reference or f'kind = "command"\ncommand = {json.dumps([sys.executable, str(FAKE)])}'
    (tmp_path / "gate.toml").write_text(
        f'name = "adv"\nprompts = "p.jsonl"\nmax_tokens = 2\ntop_logprobs = 2\noutput_dir = "{tmp_path / "r"}"\n'
        f"[reference]\n{reference}\n[candidate]\n{candidate}\n"
    )
    return subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", str(tmp_path / "gate.toml")],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _events(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _kill_and_check(gate: subprocess.Popen, pidfile: Path) -> None:
    pids = list(map(int, pidfile.read_text().split()))
    gate.send_signal(signal.SIGKILL)  # no cleanup of its own can run
    gate.communicate(timeout=30)
    try:
        _wait_for(lambda: not any(map(pid_alive, pids)), 20, "the engine processes to go")
    except AssertionError:
        raise AssertionError(f"engine processes {[p for p in pids if pid_alive(p)]} outlived the SIGKILLed gate") from None


def test_a_launched_server_does_not_outlive_a_sigkilled_gate(tmp_path, reap):
    serve = [sys.executable, str(FAKE_SERVER), "--port", "{port}", "--spawn-child", "--delay", "120",
             "--pidfile", str(tmp_path / "server.pid"), "--events", str(tmp_path / "server.events")]
    gate = _gate(tmp_path, f'kind = "openai"\nserve = {json.dumps(serve)}\nstartup_timeout_s = 60\n'
                           f"request_timeout_s = 300\nretries = 0\nstop_timeout_s = 5")
    reap.append(gate)
    _wait_for(lambda: "request" in _events(tmp_path / "server.events"), 90, "the server's first completion request")
    assert len((tmp_path / "server.pid").read_text().split()) == 2  # the server and its child
    _kill_and_check(gate, tmp_path / "server.pid")


def test_a_command_engine_ignoring_eof_and_sigterm_does_not_outlive_a_sigkilled_gate(tmp_path, reap):
    argv = [sys.executable, str(FAKE), "--mode", "hang", "--ignore-term",
            "--pidfile", str(tmp_path / "cand.pid"), "--events", str(tmp_path / "cand.events")]
    gate = _gate(tmp_path, f'kind = "command"\ncommand = {json.dumps(argv)}\ntimeout_s = 300')
    reap.append(gate)
    _wait_for(lambda: "request p0" in _events(tmp_path / "cand.events"), 60, "the candidate's first request")
    _kill_and_check(gate, tmp_path / "cand.pid")
    assert "sigterm" in _events(tmp_path / "cand.events")  # asked first, then killed


# ---------------------------------------------------------------------------- 19: engine logs
def test_an_engine_writing_100_mb_to_stderr_leaves_a_capped_log(tmp_path):
    log = tmp_path / "engine.log"
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(HOSTILE), "--flood-stderr", "100"]))
    eng.set_log_path(log)
    try:
        recs = list(eng.generate([P0], SAMPLING))
    finally:
        eng.close()
    assert recs[0].error is None
    size = log.stat().st_size
    assert size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES + 4096, size
    text = log.read_bytes()
    assert b"FIRST-LINE of the flood" in text[:1024] and b"LAST-LINE of the flood" in text[-1024:]
    assert b"bytes of engine output dropped here" in text


def test_an_in_process_arm_log_is_trimmed_when_the_arm_ends(tmp_path):
    log = tmp_path / "engine.log"
    log.write_bytes(b"an earlier arm's line\n")
    with engine_log(log, ("transformers",)):
        os.write(2, b"first\n" + b"y" * (20 * 1024 * 1024) + b"\nlast\n")  # what a C library might print
    text = log.read_bytes()
    assert len(text) <= LOG_HEAD_BYTES + LOG_TAIL_BYTES + 4096
    assert text.startswith(b"an earlier arm's line\nfirst\n") and text.endswith(b"\nlast\n")
    assert b"bytes of engine output dropped here" in text


# ---------------------------------------------------------------------------- 18: the context
def test_an_hf_prompt_over_the_model_context_is_refused_before_generation():
    from conftest import need

    need("transformers")
    from strict_gate.engines.hf import HFEngine, HFOptions

    eng = HFEngine(HFOptions(model="bundled:tiny-llama"), base_dir=ROOT)  # max_position_embeddings 512
    long = PromptInput("long", tuple(5 + i % 300 for i in range(500)))
    recs = {r.id: r for r in eng.generate([long, P0], Sampling(max_tokens=16, top_logprobs=2))}
    assert recs["long"].error == ("not run: 500 prompt tokens + max_tokens 16 exceed the model's context of "
                                  "512 tokens")
    assert recs["p0"].error is None and len(recs["p0"].token_ids) > 0


def test_a_command_engine_stating_max_context_is_not_sent_longer_prompts(tmp_path):
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(HOSTILE), "--max-context", "8",
                                                "--requests", str(tmp_path / "requests")]))
    try:
        recs = list(eng.generate([PromptInput("long", (1, 2, 3, 4, 5, 6, 7)), P0], Sampling(max_tokens=2, top_logprobs=2)))
    finally:
        eng.close()
    assert recs[0].error == "not run: 7 prompt tokens + max_tokens 2 exceed the model's context of 8 tokens"
    assert recs[1].error is None and recs[1].token_ids == (10, 11)
    assert (tmp_path / "requests").read_text().split() == ["3"]  # the long prompt never reached it


@pytest.mark.parametrize("value", ['"8"', "-1", "true"])
def test_a_hello_with_a_bad_max_context_is_refused(value):
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(HOSTILE), "--max-context", value]))
    with pytest.raises(EngineError, match='hello "max_context" must be a positive integer'):
        eng.start()
    eng.close()


def test_an_openai_prompt_over_the_served_context_is_refused(http):
    url, seen = http({("GET", "/v1/models"): _models(max_model_len=8),
                      ("POST", "/v1/completions"): lambda h: h.send_json(200, _completion(h.body()))})
    eng = _openai(url)
    recs = list(eng.generate([PromptInput("long", (1, 2, 3, 4, 5, 6, 7)), P0], SAMPLING))
    assert recs[0].error == "not run: 7 prompt tokens + max_tokens 2 exceed the model's context of 8 tokens"
    assert recs[1].error is None and eng.speed_settings()["max_context"] == 8
    assert [m for m, *_ in seen].count("POST") == 1  # only the prompt that fits was sent


def test_a_speed_rung_beyond_any_context_is_refused_at_load():
    text = ('prompts = "p.jsonl"\n[reference]\nkind = "command"\ncommand = ["x"]\n'
            '[candidate]\nkind = "command"\ncommand = ["y"]\n[speed]\nrungs = ["128/16", "99999999/1"]\n')
    with pytest.raises(ConfigError, match=r"g.toml:9: \[speed\] rung '99999999/1': 100000000 prompt \+ generated "
                                          r"tokens; a rung has at most 1048576") as e:
        parse_gate_config(text, "g.toml")
    assert e.value.exit_code == 2


def test_an_hf_gate_honours_sigterm_during_generation(tmp_path, reap):
    """SIGTERM while an in-process hf arm generates (after it refused a prompt over its
    context, which would otherwise hold it in one long forward pass): exit 3, interrupted."""
    from conftest import need

    need("transformers")
    hf = 'kind = "hf"\nmodel = "bundled:tiny-llama"'
    prompts = json.dumps({"id": "long", "token_ids": [5 + i % 300 for i in range(600)]}) + "\n" + "".join(
        json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n" for i in range(400))
    gate = _gate(tmp_path, hf, prompts, reference=hf)
    reap.append(gate)
    records = lambda: list((tmp_path / "r").glob("*/candidate/records.jsonl*"))  # noqa: E731 (the first arm run)
    _wait_for(lambda: any(len(p.read_text().splitlines()) >= 3 for p in records()), 120, "the candidate generating")
    gate.send_signal(signal.SIGTERM)
    try:
        out, _ = gate.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        gate.kill()
        raise AssertionError(f"the gate ignored SIGTERM: {gate.communicate()[0]}") from None
    assert gate.returncode == 3, out
    assert "interrupted" in out
    lines = records()[0].read_text().splitlines()
    assert "exceed the model's context of 512" in lines[0] and len(lines) < 401


# ---------------------------------------------------------------------------- 19: prompts, env names
def _prompts_cli(tmp_path: Path, content: bytes):
    path = tmp_path / "set.jsonl"
    path.write_bytes(content)
    return CliRunner().invoke(app, ["prompts", str(path)]), str(path)


def test_a_raw_u2028_inside_a_json_string_loads(tmp_path):
    text = "one\u2028two\u2029three\x85four"  # raw separators: valid inside a JSON string
    result, path = _prompts_cli(tmp_path, ('{"id": "a", "text": "' + text + '"}\n').encode())
    assert result.exit_code == 0, result.output
    assert "set: 1 prompts (1 text, 0 token ids)" in result.output
    assert load_prompts(path).prompts[0].text == text


@pytest.mark.parametrize("line, msg", [
    ('{"id": ' + "1" * 5001 + ', "text": "x"}', "Exceeds the limit (4300 digits)"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_a_huge_number_or_deep_nesting_is_exit_2_with_file_and_line(tmp_path, line, msg):
    result, path = _prompts_cli(tmp_path, b'{"id": "a", "text": "x"}\n' + line.encode() + b"\n")
    assert result.exit_code == 2, result.output
    assert f"{path}:2: invalid JSON: {msg}" in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["A=B", "A\\u0000B", ""])
def test_an_env_name_exec_would_refuse_is_exit_2_at_load(name):
    text = (f'prompts = "p.jsonl"\n[reference]\nkind = "command"\ncommand = ["x"]\n'
            f'[candidate]\nkind = "command"\ncommand = ["y"]\n[candidate.env]\nOK = "1"\n"{name}" = "1"\n')
    with pytest.raises(ConfigError, match=r"g.toml:\d+: \[candidate.env\] .*non-empty without '=' or NUL") as e:
        parse_gate_config(text, "g.toml")
    assert e.value.exit_code == 2
    assert e.value.line == (8 if "u0000" in name else 10)  # a NUL name is not found in the text: its table's line


# ---------------------------------------------------------------------------- issue 26, item 17: text-only servers


def test_a_server_that_ignores_a_token_id_prompt_is_named_from_its_usage(fake_openai, tmp_path, monkeypatch):
    """A vllm.cpp-like server: 200 OK, usage.prompt_tokens 1 for the ids sent, a completion of the
    empty prompt as text. Was: "its tokens came back as text (e.g. [])"."""
    from engines.fake_openai_server import Mode

    monkeypatch.chdir(tmp_path)
    url = fake_openai(Mode.IGNORE_IDS).url
    Path("p.jsonl").write_text(json.dumps({"id": "p0", "token_ids": list(range(1, 45))}) + "\n")
    Path("gate.toml").write_text(
        'prompts = "p.jsonl"\nmax_tokens = 4\ntop_logprobs = 2\noutput_dir = "out"\n'
        f'[reference]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(FAKE)])}\n'
        f'[candidate]\nkind = "openai"\nbase_url = "{url}"\nretries = 0\n')
    r = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    assert r.exit_code == 3, r.output
    said = " ".join(r.output.split())
    assert "44 token ids were sent as the prompt, and the server says it read 1 (usage.prompt_tokens)" in said, said
    assert "came back as text" not in said


def test_check_engine_on_an_openai_arm_keeps_the_log_tail_lines_and_never_points_to_the_hello(tmp_path, monkeypatch):
    """A launched "server" that prints two lines and exits: was "\\x0a" between the log tail's
    lines and "-> read docs/engine-protocol.md, section 4 hello" (the command protocol's)."""
    monkeypatch.chdir(tmp_path)
    serve = [sys.executable, "-c", "import sys; print('first log line'); print('second log line'); sys.exit(3)",
             "--port", "{port}"]
    Path("engine.toml").write_text(f'kind = "openai"\nserve = {json.dumps(serve)}\n')
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "check-engine", "engine.toml"],
                       capture_output=True, text=True, timeout=120, env=os.environ | {"COLUMNS": "200"})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "\\x0a" not in r.stdout
    lines = r.stdout.splitlines()
    assert any(ln.strip() == "first log line" for ln in lines) and any(ln.strip() == "second log line" for ln in lines)
    assert "engine-protocol.md" not in r.stdout and "What the openai arm needs from a server" in r.stdout
