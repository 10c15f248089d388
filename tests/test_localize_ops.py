"""Narrowing to the op (issue 27): when a layer is first beyond tolerance, a second pass dumps
the points inside that layer only, and the report names the op. Planted bugs: a copy of the
bundled checkpoint with one projection of layer k scaled by 1.01 (q_proj inside attention,
down_proj inside the MLP), served by the real hf engine against the original."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import need
from test_localize import TARGET, plant

from strict_gate.core.model_files import resolve_model
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.judge.localization import Alone
from strict_gate.localize.points import ops_of
from strict_gate.localize.render import text_lines
from strict_gate.localize.run import Settings, localize

need("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("weight", "layer", "op"), [
    ("model.layers.1.self_attn.q_proj.weight", "layers.1.attn", "layers.1.attn.q_proj"),
    ("model.layers.0.mlp.down_proj.weight", "layers.0.mlp", "layers.0.mlp.down_proj"),
])
def test_a_planted_op_bug_is_named_to_the_op(tmp_path, weight, layer, op):
    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    bad = plant(src, tmp_path / "planted", weight)
    found = localize([TARGET], HFEngine(HFOptions(model=str(src))), HFEngine(HFOptions(model=str(bad))),
                     tmp_path / "work", Settings(), release=lambda e: e.close())
    loc = found["p"]
    assert loc.error is None and loc.first_beyond == layer, [(p.name, p.rel_diff) for p in loc.points]
    assert loc.first_beyond_op == op, [(p.name, p.rel_diff) for p in loc.ops]
    inside = layer.rsplit(".", 1)[0]
    assert {p.name for p in loc.ops} <= set(ops_of(int(inside.split(".")[1]))), "only the first-beyond layer's ops"
    names = [p.name for p in loc.ops]
    assert all(not p.beyond for p in loc.ops[: names.index(op)])  # every op before it within tolerance
    assert f"inside it, first op beyond: {op} (grafted: wrong alone)" in text_lines(loc)[0]
    assert loc.verdict(op) is Alone.WRONG and loc.ops_grafted, loc.op_graft_note
    assert [o for o, v in loc.alone if v is Alone.WRONG] == [op], loc.alone  # no other op blamed


def test_an_earlier_op_bug_leaves_the_later_ops_following(tmp_path):
    """Grafting at ops (issue 27): layer 0's up_proj scaled by 1.01. The activated product and
    down_proj are beyond tolerance on the candidate's own inputs, but fed the reference's
    (mlp.act, for down_proj) they agree: they follow; only up_proj is wrong alone. Before op
    grafting, down_proj read as beyond with nothing to say it was not the bug."""
    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    bad = plant(src, tmp_path / "planted", "model.layers.0.mlp.up_proj.weight")
    loc = localize([TARGET], HFEngine(HFOptions(model=str(src))), HFEngine(HFOptions(model=str(bad))),
                   tmp_path / "work", Settings(), release=lambda e: e.close())["p"]
    assert loc.first_beyond_op == "layers.0.mlp.up_proj", [(p.name, p.rel_diff) for p in loc.ops]
    beyond = {p.name for p in loc.ops if p.beyond}
    assert {"layers.0.mlp.act", "layers.0.mlp.down_proj"} <= beyond, beyond
    assert dict(loc.alone) == {"layers.0.mlp.up_proj": Alone.WRONG, "layers.0.mlp.act": Alone.FOLLOWS,
                               "layers.0.mlp.down_proj": Alone.FOLLOWS}, loc.alone
    fed = {p.name: p for p in loc.ops_grafted}
    assert fed["layers.0.mlp.down_proj"].max_abs == 0.0  # the same weights fed the same input: equal
    lines = "\n".join(text_lines(loc))
    assert "first op beyond: layers.0.mlp.up_proj (grafted: wrong alone)" in lines
    assert f"{Alone.FOLLOWS}: layers.0.mlp.act, layers.0.mlp.down_proj" in lines
    data = loc.to_json()
    assert data["alone"]["layers.0.mlp.down_proj"] == str(Alone.FOLLOWS)
    assert data["first_beyond_op_alone"] == "wrong alone"


def test_without_op_graft_the_report_says_why(tmp_path):
    """--no-graft: the narrowing pass still names the op, with no verdict and no claim."""
    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    bad = plant(src, tmp_path / "planted", "model.layers.0.mlp.down_proj.weight")
    loc = localize([TARGET], HFEngine(HFOptions(model=str(src))), HFEngine(HFOptions(model=str(bad))),
                   tmp_path / "work", Settings(graft=False), release=lambda e: e.close())["p"]
    assert loc.first_beyond_op == "layers.0.mlp.down_proj" and not loc.alone and not loc.ops_grafted
    assert "grafted" not in text_lines(loc)[0]


def test_a_planted_kda_op_bug_is_named_to_the_op(tmp_path):
    """The KDA example (candidate) against hf (reference) on the tiny Kimi-Linear, layer 2's KDA
    beta projection (b_proj) scaled by 1.05: narrowed to layers.2.attn.beta_proj, every op before
    it (the norm, q/k/v, the forget gate) equal."""
    from test_localize import KDA_MODEL, kda

    bad = plant(KDA_MODEL, tmp_path / "planted", "model.layers.2.self_attn.b_proj.weight", scale=1.05)
    loc = localize([TARGET], HFEngine(HFOptions(model=str(KDA_MODEL), threads=1)), kda(bad), tmp_path / "work",
                   Settings(), release=lambda e: e.close())["p"]
    assert loc.error is None and loc.first_beyond == "layers.2.attn", [(p.name, p.rel_diff) for p in loc.points]
    assert loc.first_beyond_op == "layers.2.attn.beta_proj", [(p.name, p.rel_diff) for p in loc.ops]
    before = [p for p in loc.ops][: [p.name for p in loc.ops].index("layers.2.attn.beta_proj")]
    assert [p.name for p in before] == ["layers.2.attn_norm", "layers.2.attn.q_proj", "layers.2.attn.k_proj",
                                        "layers.2.attn.v_proj", "layers.2.attn.forget"]
    assert all(p.max_abs == 0.0 for p in before)
    # grafted at ops (the KDA example declares graft_ops): beta_proj wrong alone, nothing else
    assert loc.verdict("layers.2.attn.beta_proj") is Alone.WRONG, (loc.alone, loc.op_graft_note)
    assert [op for op, v in loc.alone if v is Alone.WRONG] == ["layers.2.attn.beta_proj"], loc.alone


@pytest.mark.parametrize(("weight", "layer", "op", "before"), [
    # the router: its logits, before the chosen experts and every expert
    ("model.layers.2.block_sparse_moe.gate.weight", "layers.2.mlp", "layers.2.mlp.router", ["layers.2.mlp_norm"]),
    # expert 2's down projection (w2); experts 0 and 1, also chosen at the kept positions, equal
    ("model.layers.2.block_sparse_moe.experts.2.w2.weight", "layers.2.mlp", "layers.2.mlp.experts.2.down_proj",
     ["layers.2.mlp_norm", "layers.2.mlp.router", "layers.2.mlp.experts.chosen", "layers.2.mlp.experts.0.down_proj",
      "layers.2.mlp.experts.1.down_proj"]),
    # MLA's compressed latent (kv_a_proj_with_mqa) in layer 3; its q projection equal
    ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "layers.3.attn", "layers.3.attn.kv_a_proj",
     ["layers.3.attn_norm", "layers.3.attn.q_proj"]),
])
def test_a_planted_moe_or_mla_bug_is_named_to_its_sub_point(tmp_path, weight, layer, op, before):
    """The KDA example (candidate) against hf (reference) on the tiny Kimi-Linear, one weight of a
    MoE block or of the MLA layer scaled by 1.05: narrowed to the router, the one expert or MLA's
    latent projection, every sub-point before it equal (both engines give every one of them)."""
    from test_localize import KDA_MODEL, kda

    bad = plant(KDA_MODEL, tmp_path / "planted", weight, scale=1.05)
    loc = localize([TARGET], HFEngine(HFOptions(model=str(KDA_MODEL), threads=1)), kda(bad), tmp_path / "work",
                   Settings(), release=lambda e: e.close())["p"]
    assert loc.error is None and loc.first_beyond == layer, [(p.name, p.rel_diff) for p in loc.points]
    assert loc.first_beyond_op == op, [(p.name, p.rel_diff, p.note) for p in loc.ops]
    names = [p.name for p in loc.ops]
    assert [n for n in names[: names.index(op)] if n.startswith(layer)] == before
    assert all(p.max_abs == 0.0 for p in loc.ops[: names.index(op)])
    assert not [p.name for p in loc.ops if p.rel_diff is None], "every sub-point given by both engines"
    assert f"inside it, first op beyond: {op}" in text_lines(loc)[0]


def test_a_rotary_only_difference_is_named_to_q_after_rotary(tmp_path, monkeypatch):
    """A gate run from its own directory with relative paths (a user's run): the candidate is
    the bundled model with only its config's rope_theta changed, so every projection is equal
    and q and k differ from the rotary on: the narrowing pass names layers.0.attn.q_rope, captured
    from transformers' own apply_rotary_pos_emb call (engines/torch_taps.py)."""
    import json
    import shutil

    from helpers import write_gate

    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import run_gate

    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    shutil.copytree(src, tmp_path / "models/reference")
    shutil.copytree(src, tmp_path / "models/rope")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["rope_parameters"]["rope_theta"] = 500.0
    (tmp_path / "models/rope/config.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.copy(ROOT / "prompts/smoke.jsonl", tmp_path / "prompts.jsonl")
    monkeypatch.chdir(tmp_path)
    write_gate(Path("."), prompts="prompts.jsonl", max_tokens=8, policy="strict", output_dir="reports",
               localize=True, reference={"kind": "hf", "model": "models/reference"},
               candidate={"kind": "hf", "model": "models/rope"})
    report_dir = run_gate(load_gate_config(Path("gate.toml"))).report_dir
    report = json.loads((Path(report_dir) / "report.json").read_text(encoding="utf-8"))
    located = [p["localization"] for p in report["prompts"] if p.get("localization")]
    assert located, "the rope change diverges on some smoke prompt"
    for loc in located:
        assert loc["first_beyond"] == "layers.0.attn" and loc["first_beyond_op"] == "layers.0.attn.q_rope", loc["ops"]
        ops = {p["name"]: p for p in loc["ops"]}
        assert all(ops[f"layers.0.{o}"]["max_abs"] == 0.0 for o in ("attn_norm", "attn.q_proj", "attn.k_proj"))
        assert ops["layers.0.attn.k_rope"]["beyond"]


def test_moe_and_mla_sub_points_are_the_same_along_the_decode_path(tmp_path):
    """hf on the tiny Kimi-Linear, layer 3 (MLA + MoE): a prefill dump and a decode-path dump
    (prefill of 30 ids, then one id at a time) give the same names and values (kv_b_proj keeps
    only each pass's own rows, though a decode step expands every cached position); each expert's
    rows are zero exactly where the chosen ids lack it, and the chosen ids are sorted."""
    import torch
    from safetensors.torch import load_file
    from test_localize import KDA_MODEL
    from transformers import AutoModelForCausalLM

    from strict_gate.engines.base import DumpRequest
    from strict_gate.engines.torch_dump import dump_hf_model
    from strict_gate.localize.compare import compare_points

    model = AutoModelForCausalLM.from_pretrained(str(KDA_MODEL), dtype=torch.float32).eval()
    dumps = {}
    for path, decode_from in (("prefill", None), ("decode", 30)):
        request = DumpRequest(TARGET.token_ids, ops_of(3), TARGET.positions, tmp_path / path, None, decode_from)
        request.directory.mkdir()
        dumps[path] = load_file(str(dump_hf_model(torch, model, request).path))
    prefill, decode = dumps["prefill"], dumps["decode"]
    assert sorted(prefill) == sorted(decode) and "layers.3.attn.kv_b_proj" in prefill
    assert not [p.name for p in compare_points(prefill, decode, 1e-10) if p.beyond or p.rel_diff is None]
    chosen = prefill["layers.3.mlp.experts.chosen"]
    assert bool((chosen[:, :-1] < chosen[:, 1:]).all())
    experts = [n for n in prefill if n.startswith("layers.3.mlp.experts.") and n.endswith(".down_proj")]
    assert len(experts) >= 2
    for name in experts:
        e = float(name.split(".")[4])
        assert ((prefill[name].abs().sum(-1) > 0) == (chosen == e).any(-1)).all(), name
