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


def test_the_vllm_copy_of_kimi_renames_only_what_vllms_loader_reads(tmp_path):
    """prepare.kimi_vllm on the shipped tiny Kimi-Linear: the dense layers' MLP moves from
    block_sparse_moe. to mlp., the config says which layers are dense and which are KDA the way vLLM
    0.26's KimiLinearConfig reads it, and every tensor is the same."""
    import importlib.util
    import json
    import shutil

    from safetensors.numpy import load_file

    spec = importlib.util.spec_from_file_location("gpu_prepare", HERE / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    src = tmp_path / "tiny-kimi-linear"
    shutil.copytree(ROOT / prepare.KIMI, src)
    dst = prepare.kimi_vllm(src)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["first_k_dense_replace"] == 1 and cfg["moe_layer_freq"] == 1
    assert cfg["linear_attn_config"] == {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "head_dim": 64,
                                         "num_heads": 2, "short_conv_kernel_size": 4}
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    moved = {k: k.replace(".block_sparse_moe.", ".mlp.") for k in before if k.startswith("model.layers.0.block_sparse_moe.")}
    assert sorted(moved) == [f"model.layers.0.block_sparse_moe.{p}_proj.weight" for p in ("down", "gate", "up")]
    assert set(after) == {moved.get(k, k) for k in before}
    assert all((after[moved.get(k, k)] == v).all() for k, v in before.items())
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert not dst.with_name(dst.name + ".partial").exists()
