"""Every benchmarks/gpu_vllm/*.toml (the issue-35 device run, kept out of gates/: gates/ files
need an acceptance row) loads through the product's own config loader, with vLLM's argument
check where vLLM is installed; the run script's --cpu-dry-run mapping loads too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from strict_gate.gate.config import load_gate_config

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks" / "gpu_vllm"
TOMLS = sorted(HERE.glob("*.toml"))


def test_there_is_a_config_for_each_step():
    names = {p.stem for p in TOMLS}
    assert {"capture-tiny-fp32", "capture-smol-bf16", "gpuvllm-vs-cpu-smol-fp32", "hf-cuda-vs-gpuvllm-tiny-bf16",
            "speed-hf-cuda-vs-vllm-eager", "speed-hf-cuda-vs-vllm-graphs", "invariance-gpu-vllm",
            "invariance-gpu-vllm-batch-invariant", "kimi-vllm-vs-kda-chunk", "kimi-vllm-vs-hf"} <= names


@pytest.mark.parametrize("path", TOMLS, ids=lambda p: p.stem)
def test_every_gpu_config_loads(path, monkeypatch):
    monkeypatch.chdir(HERE)  # relative to the file, from its own directory
    cfg = load_gate_config(path.name, require_candidate=not path.stem.startswith("capture-"))
    assert cfg.reference is not None


def test_the_cpu_dry_run_mapping_loads(tmp_path):
    out = tmp_path / "tomls"
    subprocess.run([sys.executable, str(HERE / "prepare.py"), "--cpu", "--prompts", "2", "--runs", "2",
                    "--out", str(out), *map(str, TOMLS)], check=True, cwd=ROOT)
    for path in sorted(out.glob("*.toml")):
        text = "\n".join(x for x in path.read_text().splitlines() if not x.startswith("#"))
        assert "\"cuda\"" not in text and "gpu_memory_utilization" not in text and "# gpu-only" not in text, path.name
        cfg = load_gate_config(path, require_candidate=not path.stem.startswith("capture-"))
        assert cfg.reference is not None
