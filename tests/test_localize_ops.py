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
from strict_gate.localize.run import Settings, localize
from strict_gate.report.localization import text_lines

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
