"""The CTranslate2 adapter (examples/engines/ctranslate2_engine.py), real engine, real gates.

The engine runs under its own interpreter (.venvs/ctranslate2) on models converted by
scripts/install-ctranslate2.sh. Without them these tests skip, except under CI, where they
fail: CI installs the engine (.ci/run), and a gate whose engine tests were skipped proves
nothing. The shipped gates run as shipped: the full 128-prompt battery against the committed
vLLM float32 baseline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import child_pid

from strict_gate.engines.base import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.errors import EngineError
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Sampling

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venvs" / "ctranslate2" / "bin" / "python"
ADAPTER = ROOT / "examples" / "engines" / "ctranslate2_engine.py"
MODELS = ROOT / "build" / "ct2"
INSTALL = "bash scripts/install-ctranslate2.sh"


def need_ctranslate2() -> None:
    """conftest.need() for an engine in another interpreter: fail under CI, skip elsewhere."""
    missing = [str(p.relative_to(ROOT)) for p in (PYTHON, *(MODELS / f"tiny-llama-{q}" / "model.bin"
                                                          for q in ("float32", "int8", "int16"))) if not p.exists()]
    if not missing:
        return
    why = f"the CTranslate2 engine is not installed ({', '.join(missing)} missing); install with: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


need_ctranslate2()


def cli(*args: str, **kw) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "strict_gate.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def engine(model: str, log: Path, compute_type: str | None = None, eos: list[int] | None = None,
           **env: str) -> CommandEngine:
    """The adapter on build/ct2/tiny-llama-<model>, started over the command protocol."""
    argv = [str(PYTHON), str(ADAPTER), "--model", str(MODELS / f"tiny-llama-{model}"),
            "--compute-type", compute_type or model]
    eng = CommandEngine(CommandOptions(command=argv, log=str(log), eos_token_ids=eos), env=env, base_dir=ROOT)
    eng.start()
    return eng


def test_float32_gate_passes_against_the_vllm_baseline(tmp_path):
    cfg = load_gate_config(ROOT / "gates" / "ctranslate2-float32.toml")
    t0 = time.monotonic()
    outcome = run_gate(cfg, output_dir=tmp_path)
    r = outcome.result
    assert r.verdict.verdict == "pass" and r.exit_code == 0, r.verdict.reasons
    s = r.comparison.summary
    assert (s.prompts_exact, s.prompts_total) == (128, 128)
    assert s.positions_matched == s.positions_total == 2033  # the baseline's tokens, EOS stops included
    m = json.loads((outcome.report_dir / "candidate" / "manifest.json").read_text())
    assert m["engine"]["versions"]["ctranslate2"] == "4.8.5"
    assert m["engine"]["options"]["hello"]["settings"]["compute_type"] == "float32"
    print(f"float32: 128/128 exact in {time.monotonic() - t0:.1f} s")


def test_int8_gate_fails_with_its_flips_classified(tmp_path):
    """int8 weights flip tokens: the gate says so (exit 1), classifies and re-scores each flip."""
    from conftest import need

    need("vllm")  # the [rescorer] re-scores the flips
    proc = cli("gate", str(ROOT / "gates" / "ctranslate2-int8.toml"), "-o", str(tmp_path))
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 1, out
    (d,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    r = json.loads((d / "report.json").read_text())
    counts = r["summary"]["counts"]
    flipped = [p for p in r["prompts"] if p["status"] != "match"]
    assert flipped and not r["problems"]
    assert {p["status"] for p in flipped} <= {"near_tie", "divergent"}, counts
    assert counts["near_tie"] + counts["divergent"] == len(flipped)
    assert r["rescored_by"] == "vllm bundled:tiny-llama"
    for p in flipped:  # every flip has its first divergence and vLLM's teacher-forced verdict
        assert p["first_divergence"] is not None and p["diagnosis"]["error"] is None, p["id"]
    print(f"int8: {counts['match']}/128 exact, {counts['near_tie']} near-ties, {counts['divergent']} divergent")


def _engine_pid(gate_pid: int) -> int | None:
    return child_pid(gate_pid, str(ADAPTER).encode())


def test_kill_9_of_the_engine_mid_run_is_exit_3_and_keeps_finished_prompts(tmp_path):
    proc = cli("gate", str(ROOT / "gates" / "ctranslate2-float32.toml"), "-o", str(tmp_path / "r"))
    deadline, partial = time.monotonic() + 120, None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((tmp_path / "r").glob("*/candidate/records.jsonl.partial"))
        if found and found[0].read_text().count("\n") >= 5:
            partial = found[0]
            break
        time.sleep(0.005)
    pid = _engine_pid(proc.pid)
    assert partial is not None and pid is not None, "the engine never got going: " + proc.communicate()[0][-2000:]
    os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 3, out
    assert "SIGKILL" in out, out
    d = partial.parent.parent
    kept = len(load_run(d / "candidate", allow_incomplete=True).records)
    m = json.loads((d / "candidate" / "manifest.json").read_text())
    assert m["status"] == "failed" and 5 <= kept < 128, (m["status"], kept)
    r = json.loads((d / "report.json").read_text())
    assert r["verdict"] == "incomplete" and r["summary"]["counts"]["missing"] == 128 - kept
    before = (d / "candidate" / "records.jsonl").read_bytes()

    resumed = cli("gate", "--resume", str(d))
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out
    assert f"candidate kept {kept}, generated {128 - kept}" in out, out
    assert (d / "candidate" / "records.jsonl").read_bytes().startswith(before)  # kept byte for byte
    print(f"killed after {kept} prompts; the resumed gate passed")


def test_score_reads_back_the_engines_own_tokens(tmp_path):
    """Teacher forcing (forward_batch) agrees with generation (generate_batch's logits)."""
    eng = engine("float32", tmp_path / "e.log")
    try:
        prompt = PromptInput("p", (1, 50, 81, 317, 311, 623, 263, 898))
        (rec,) = eng.generate([prompt], Sampling(max_tokens=12, top_logprobs=5))
        steps = eng.score(prompt.token_ids, rec.token_ids, 5)
    finally:
        eng.close()
    assert [s.token_id for s in steps] == list(rec.token_ids)
    for s, top in zip(steps, rec.top_logprobs):
        assert s.argmax == top[0][0]  # greedy: the generated token is the scored argmax
        assert abs(s.logprob - top[0][1]) < 1e-4
        assert len(s.top) == 5 and all(a[1] >= b[1] for a, b in zip(s.top, s.top[1:]))


def test_the_requests_eos_token_ids_end_the_sequence(tmp_path):
    """The gate's eos_token_ids (vLLM's set) are what the engine stops on, EOS included."""
    prompt, sampling = PromptInput("p", (1, 50, 81, 317, 311, 623, 263, 898)), Sampling(max_tokens=12, top_logprobs=2)
    eng = engine("float32", tmp_path / "e.log")
    (free,) = eng.generate([prompt], sampling)
    eng.close()
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.token_ids[3]
    eng = engine("float32", tmp_path / "e.log", eos=[stop])
    (rec,) = eng.generate([prompt], sampling)
    eng.close()
    assert rec.finish_reason == "stop" and rec.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]


@pytest.mark.parametrize("model, compute_type", [("float32", "bfloat16"), ("int16", "int16")])
def test_unsupported_compute_type_is_refused_not_swapped(tmp_path, model, compute_type):
    """CTranslate2 would silently run an int16 model as int8_float32: the adapter refuses, and
    says what to do. Whether this CPU has the type is read from CTranslate2, not assumed."""
    supported = subprocess.run(
        [str(PYTHON), "-c", "import ctranslate2; print(*ctranslate2.get_supported_compute_types('cpu'))"],
        capture_output=True, text=True, check=True, env=os.environ | {"CT2_USE_MKL": "0"},
    ).stdout.split()
    if compute_type in supported:
        eng = engine(model, tmp_path / "e.log", compute_type, CT2_USE_MKL="0")
        assert eng.hello["settings"]["compute_type"] == compute_type
        eng.close()
        return
    with pytest.raises(EngineError, match=f"refuses compute type {compute_type} on this CPU") as e:
        engine(model, tmp_path / "e.log", compute_type, CT2_USE_MKL="0")
    assert "pick one of those with --compute-type" in str(e.value)
