"""The OpenVINO GenAI adapter (examples/engines/openvino_engine.py), real engine, real gates.

The engine runs under its own interpreter (.venvs/openvino) on IR converted by
scripts/install-openvino.sh. Without them these tests skip, except under CI, where they
fail: CI installs the engine (scripts/test.sh), and a gate whose engine tests were skipped
proves nothing. The shipped tiny-llama gate runs as shipped: the full 128-prompt battery
against the committed vLLM float32 baseline. The real-model gates (gates/smollm2-openvino-*)
are the acceptance run's (benchmarks/acceptance.toml), too slow for CI's budget.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from strict_gate.engines.base import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.runs.records import Sampling

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venvs" / "openvino" / "bin" / "python"
ADAPTER = ROOT / "examples" / "engines" / "openvino_engine.py"
MODELS = ROOT / "build" / "openvino"
INSTALL = "bash scripts/install-openvino.sh"
PROMPT = PromptInput("p", (1, 50, 81, 317, 311, 623, 263, 898))


def need_openvino() -> None:
    """conftest.need() for an engine in another interpreter: fail under CI, skip elsewhere."""
    missing = [str(p.relative_to(ROOT)) for p in (PYTHON, *(MODELS / f"tiny-llama-{w}" / "openvino_model.xml"
                                                          for w in ("f32", "int8"))) if not p.exists()]
    if not missing:
        return
    why = f"the OpenVINO engine is not installed ({', '.join(missing)} missing); install with: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


need_openvino()


def engine(weights: str, log: Path, precision: str = "f32", eos: list[int] | None = None) -> CommandEngine:
    """The adapter on build/openvino/tiny-llama-<weights>, started over the command protocol."""
    argv = [str(PYTHON), str(ADAPTER), "--model", str(MODELS / f"tiny-llama-{weights}"), "--precision", precision]
    eng = CommandEngine(CommandOptions(command=argv, log=str(log), eos_token_ids=eos), base_dir=ROOT)
    eng.start()
    return eng


def test_f32_gate_passes_against_the_vllm_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_gate_config(ROOT / "gates" / "openvino-f32.toml")
    t0 = time.monotonic()
    outcome = run_gate(cfg, output_dir=Path("out"))
    r = outcome.result
    assert r.verdict.verdict == "pass" and r.exit_code == 0, r.verdict.reasons
    s = r.comparison.summary
    assert (s.prompts_exact, s.prompts_total) == (128, 128)
    assert s.positions_matched == s.positions_total
    m = json.loads((outcome.report_dir / "candidate" / "manifest.json").read_text())
    assert m["engine"]["versions"]["openvino_genai"].startswith("2026.4.1")
    settings = m["engine"]["options"]["hello"]["settings"]
    assert (settings["INFERENCE_PRECISION_HINT"], settings["KV_CACHE_PRECISION"]) == ("f32", "f32")
    print(f"f32: 128/128 exact in {time.monotonic() - t0:.1f} s")


def test_genai_tokens_agree_with_the_stepped_logits_and_with_score(tmp_path):
    """GenAI's greedy tokens are the argmax of plain OpenVINO's stepped logits, and teacher
    forcing (one pass over prompt + continuation) reads the same tokens and logprobs back."""
    eng = engine("f32", tmp_path / "e.log")
    try:
        (rec,) = eng.generate([PROMPT], Sampling(max_tokens=12, top_logprobs=5))
        steps = eng.score(PROMPT.token_ids, rec.token_ids, 5)
    finally:
        eng.close()
    assert "GenAI chose" not in (tmp_path / "e.log").read_text()
    assert [s.token_id for s in steps] == list(rec.token_ids)
    for s, top in zip(steps, rec.top_logprobs):
        assert s.argmax == top[0][0] == s.token_id
        assert abs(s.logprob - top[0][1]) < 1e-4
        assert len(s.top) == 5 and all(a[1] >= b[1] for a, b in zip(s.top, s.top[1:]))


def test_the_requests_eos_token_ids_end_the_sequence(tmp_path):
    """The gate's eos_token_ids (vLLM's set) are what GenAI stops on, the EOS kept."""
    sampling = Sampling(max_tokens=12, top_logprobs=2)
    eng = engine("f32", tmp_path / "e.log")
    (free,) = eng.generate([PROMPT], sampling)
    eng.close()
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.token_ids[3]
    eng = engine("f32", tmp_path / "e.log", eos=[stop])
    (rec,) = eng.generate([PROMPT], sampling)
    eng.close()
    assert rec.finish_reason == "stop" and rec.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]


def test_the_hello_says_what_the_cpu_plugin_compiled(tmp_path):
    """f32 (compute, KV cache, no dynamic quantisation of the activations) is pinned and read back;
    `native` reports the plugin's own defaults, whatever this CPU makes of them (bf16 compute, a u8
    KV cache and activation groups of 32 on the AVX512-BF16 dev box)."""
    eng = engine("int8", tmp_path / "e.log")
    pinned = eng.hello["settings"]
    eng.close()
    assert (pinned["INFERENCE_PRECISION_HINT"], pinned["KV_CACHE_PRECISION"]) == ("f32", "f32")
    assert pinned["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0"  # int8 weights, activations not quantised
    eng = engine("f32", tmp_path / "e.log", precision="native")
    native = eng.hello["settings"]
    eng.close()
    assert native["precision"] == "native" and native["INFERENCE_PRECISION_HINT"] in ("f32", "bf16", "f16")
