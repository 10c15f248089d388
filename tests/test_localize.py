"""Localisation with real engines: a planted bug is named, grafting isolates it, and the KDA
example's recurrent prefill first differs in a KDA block, never the MLA one.

A planted bug is a copy of a real checkpoint with one weight matrix of layer k scaled by 1.01
(`self_attn.o_proj` for the attention block, the MLP's down projection for the MLP block):
the candidate is that copy, served by the real engine; the reference is the original. Every
assertion names the planted layer, so a localisation that names another fails.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import need

from strict_gate.core.model_files import resolve_model
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.localize.run import Settings, Target, localize

need("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
KDA_MODEL = ROOT / "examples/models/tiny-kimi-linear"
KDA_ENGINE = ROOT / "examples/engines/kda_engine.py"
IDS = tuple([1] + [(29 * j + 7) % 1000 + 4 for j in range(40)])
TARGET = Target("p", IDS, tuple(range(len(IDS) - 8, len(IDS))))


def plant(src: Path, dst: Path, weight: str, scale: float = 1.01) -> Path:
    """A copy of the checkpoint at `src` with the tensor `weight` scaled."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    assert weight in tensors, f"{weight} not in the checkpoint"
    tensors[weight] = tensors[weight] * scale
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def deep_llama(tmp_path_factory) -> Path:
    """An 8-layer Llama of the bundled model's shape, random weights (seed 0), float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    cfg = LlamaConfig.from_pretrained(src)
    cfg.num_hidden_layers = 8
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("deep") / "llama-8"
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in src.glob("*token*"):
        shutil.copy(f, out / f.name)
    return out


def run(reference, candidate, tmp_path: Path, **settings):
    found = localize([TARGET], reference, candidate, tmp_path / "work", Settings(**settings),
                     release=lambda e: e.close())
    return found["p"]


def check_named(loc, k: int, block: str) -> None:
    """The planted sub-block is the first point beyond tolerance, everything before it within
    tolerance, and grafted, only layer k's points are beyond."""
    planted = f"layers.{k}.{block}"
    assert loc.error is None, loc.error
    assert loc.first_beyond == planted, [(p.name, p.rel_diff) for p in loc.points]
    names = [p.name for p in loc.points]
    assert all(not p.beyond and p.note is None for p in loc.points[: names.index(planted)])
    assert loc.grafted, "both arms graft: the grafted curve must be there"
    assert planted in loc.grafted_beyond
    assert {name.split(".")[1] for name in loc.grafted_beyond} == {str(k)}, loc.grafted_beyond


WEIGHT = {"attn": "model.layers.{k}.self_attn.o_proj.weight", "mlp": "model.layers.{k}.mlp.down_proj.weight"}


@pytest.mark.parametrize(("k", "block"), [(0, "mlp"), (1, "attn"), (1, "mlp")])
def test_hf_planted_bug_in_the_bundled_model_is_named(tmp_path, k, block):
    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    bad = plant(src, tmp_path / "planted", WEIGHT[block].format(k=k))
    loc = run(HFEngine(HFOptions(model=str(src))), HFEngine(HFOptions(model=str(bad))), tmp_path)
    check_named(loc, k, block)


@pytest.mark.parametrize(("k", "block"), [(2, "attn"), (5, "mlp"), (7, "attn")])
def test_hf_planted_bug_in_an_8_layer_model_is_named(tmp_path, deep_llama, k, block):
    bad = plant(deep_llama, tmp_path / "planted", WEIGHT[block].format(k=k))
    loc = run(HFEngine(HFOptions(model=str(deep_llama))), HFEngine(HFOptions(model=str(bad))), tmp_path)
    check_named(loc, k, block)


def kda(model: Path, *, prefill: str = "1") -> CommandEngine:
    return CommandEngine(
        CommandOptions(command=[sys.executable, str(KDA_ENGINE), "--model", str(model), "--dtype", "float32"],
                       timeout_s=300, startup_timeout_s=300),
        env={"DEVICE_KDA": "1", "KDA_CHUNK_PREFILL": prefill, "KDA_THREADS": "1"}, base_dir=ROOT)


KDA_WEIGHT = {  # layer 0's MLP is dense, later ones MoE with a shared expert; layer 3 is MLA
    (0, "mlp"): "model.layers.0.block_sparse_moe.down_proj.weight",
    (2, "attn"): "model.layers.2.self_attn.o_proj.weight",
    (2, "mlp"): "model.layers.2.block_sparse_moe.shared_experts.down_proj.weight",
    (3, "attn"): "model.layers.3.self_attn.o_proj.weight",
}


@pytest.mark.parametrize(("k", "block"), sorted(KDA_WEIGHT))
def test_kda_example_planted_bug_is_named(tmp_path, k, block):
    bad = plant(KDA_MODEL, tmp_path / "planted", KDA_WEIGHT[(k, block)])
    loc = run(HFEngine(HFOptions(model=str(KDA_MODEL), threads=1)), kda(bad), tmp_path)
    assert loc.tolerance == 1e-10  # float32 on both arms: the KDA engine says its dtype in its hello
    check_named(loc, k, block)


def test_kda_recurrent_prefill_first_differs_in_a_kda_block_never_the_mla_one(tmp_path):
    """float32, chunk (reference, transformers) vs recurrent prefill (the example, KDA_CHUNK_PREFILL=0).
    The difference is reduction order (rel_diff ~1e-13): within the float32 default, beyond 1e-15."""
    loc = run(HFEngine(HFOptions(model=str(KDA_MODEL), threads=1)), kda(KDA_MODEL, prefill="0"), tmp_path,
              tolerance=1e-15)
    kda_blocks = {"layers.0.attn", "layers.1.attn", "layers.2.attn"}
    assert loc.first_beyond in kda_blocks, [(p.name, p.rel_diff) for p in loc.points]
    assert loc.first_differs in kda_blocks
    grafted = {p.name: p for p in loc.grafted}
    assert grafted["layers.3.attn"].max_abs == 0.0  # the MLA block, fed the reference's input: exact
    assert any(grafted[b].max_abs > 0 for b in kda_blocks)


def test_identical_arms_are_equal_at_every_point(tmp_path):
    src = str(resolve_model("bundled:tiny-llama", ROOT))
    loc = run(HFEngine(HFOptions(model=src)), HFEngine(HFOptions(model=src)), tmp_path)
    assert loc.first_beyond is None and loc.first_differs is None
    assert [p.name for p in loc.points][:2] == ["embed", "layers.0.attn"] and loc.points[-1].name == "logits"
    assert not (tmp_path / "work").exists()  # tensors are kept only with keep
