"""The parts of localisation that need no model: the comparison's invariants, the point names,
the config, and a report's localisation in every format (no torch for the formats)."""

from __future__ import annotations

import pytest
from helpers import gate_text
from hypothesis import given, settings
from hypothesis import strategies as st

from strict_gate.core.sections import written
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.config import parse_gate_config
from strict_gate.judge import restore
from strict_gate.judge.localization import Localization, PointDiff
from strict_gate.judge.schema import LocalizationDoc
from strict_gate.localize.config import Scope
from strict_gate.localize.config import of as localize_settings
from strict_gate.localize.points import OPS, family_of, in_depth_order, is_point, ops_of, parse_points
from strict_gate.localize.render import svg_curve, text_lines

torch = pytest.importorskip("torch")
from strict_gate.localize.compare import compare_points, default_tolerance, point_diff

floats = st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=32)


@settings(max_examples=60, deadline=None)
@given(floats, floats, st.floats(1e-3, 1e3))
def test_rel_diff_is_symmetric_bounded_and_scale_free(xs, ys, scale):
    n = min(len(xs), len(ys))
    x, y = torch.tensor(xs[:n]).reshape(1, n), torch.tensor(ys[:n]).reshape(1, n)
    a, b = point_diff("p", x, y, 1e-3), point_diff("p", y, x, 1e-3)
    assert a.rel_diff == pytest.approx(b.rel_diff, abs=1e-12)
    assert 0.0 <= a.rel_diff <= 2.0
    scaled = point_diff("p", x * scale, y * scale, 1e-3)
    assert scaled.rel_diff == pytest.approx(a.rel_diff, rel=1e-6, abs=1e-9)
    assert point_diff("p", x, x, 1e-3).rel_diff == 0.0


def test_a_shape_mismatch_and_an_absent_point_are_not_comparable_and_say_why():
    ref = {"embed": torch.ones(2, 4), "layers.0": torch.ones(2, 4), "norm": torch.ones(2, 4)}
    cand = {"embed": torch.ones(2, 4), "layers.0": torch.ones(2, 5)}
    out = {p.name: p for p in compare_points(ref, cand, 1e-3)}
    assert "shapes differ" in out["layers.0"].note and out["norm"].note == "absent on the candidate"
    assert not any(p.beyond for p in out.values())


def test_points_order_and_names():
    assert in_depth_order(["logits", "layers.1", "layers.0.mlp", "embed", "layers.0.attn", "norm", "layers.0"]) == [
        "embed", "layers.0.attn", "layers.0.mlp", "layers.0", "layers.1", "norm", "logits"]
    assert parse_points(None) is None
    with pytest.raises(InputError, match="unknown point name"):
        parse_points("layers.01,embed")


def test_sub_point_names_order_and_the_experts_family():
    """The points inside a layer (docs/localize.md): rotary, MLA, router, chosen and each expert,
    in depth order (experts by number, not by text); an expert is asked for by its family."""
    names = ["layers.0.mlp.experts.10.down_proj", "layers.0.mlp", "layers.0.mlp.experts", "layers.0.mlp.experts.2.down_proj",
             "layers.0.mlp.experts.chosen", "layers.0.mlp.router", "layers.0.mlp.shared.down_proj", "layers.0.attn.q_rope",
             "layers.0.attn.kv_b_proj", "layers.0.attn.kv_a_norm", "layers.0.attn.kv_a_proj", "layers.0.attn.q_proj",
             "layers.0.attn.k_rope", "layers.0.mlp_norm"]
    assert in_depth_order(names) == [
        "layers.0.attn.q_proj", "layers.0.attn.kv_a_proj", "layers.0.attn.kv_a_norm", "layers.0.attn.kv_b_proj",
        "layers.0.attn.q_rope", "layers.0.attn.k_rope", "layers.0.mlp_norm", "layers.0.mlp.router",
        "layers.0.mlp.experts.chosen", "layers.0.mlp.experts.2.down_proj", "layers.0.mlp.experts.10.down_proj",
        "layers.0.mlp.experts", "layers.0.mlp.shared.down_proj", "layers.0.mlp"]
    assert parse_points(",".join(names)) == tuple(in_depth_order(names))
    for bad in ("layers.0.mlp.experts.01.down_proj", "layers.0.mlp.experts.x.down_proj", "layers.0.mlp.experts.2",
                "layers.0.attn.q_rope.x", "layers.0.mlp.router.weight"):
        assert not is_point(bad), bad
    assert family_of("layers.3.mlp.experts.7.down_proj") == "layers.3.mlp.experts.down_proj"
    assert "layers.3.mlp.experts.down_proj" in ops_of(3) and len(ops_of(3)) == len(OPS)


def test_the_engines_copy_of_the_names_is_the_canonical_one():
    """engines/ may not import localize/: torch_taps keeps its own expert family; they agree."""
    from strict_gate.engines import torch_taps

    name = "layers.12.mlp.experts.3.down_proj"
    assert torch_taps.family(name) == family_of(name) and torch_taps.family("layers.1.mlp") == "layers.1.mlp"
    taps = {torch_taps.ROPE, "attn.k_rope", torch_taps.KV_B, torch_taps.ROUTER, torch_taps.CHOSEN, torch_taps.ROUTED,
            torch_taps.EXPERTS}
    assert taps <= set(OPS)


def test_chosen_experts_are_compared_exactly():
    """Ids, not activations: one id off among large ids is a rel_diff far under any tolerance,
    and still beyond; the note says how it was compared, so no line reads "beyond" beside a
    rel_diff within tolerance without its reason."""
    ref = torch.tensor([[0.0, 200.0], [1.0, 3.0]])
    cand = torch.tensor([[0.0, 201.0], [1.0, 3.0]])
    p = point_diff("layers.2.mlp.experts.chosen", ref, cand, 1e-3)
    assert p.rel_diff < 1e-3 and p.beyond and p.note == "compared exactly (ids): 1 of 4 differ"
    same = point_diff("layers.2.mlp.experts.chosen", ref, ref.clone(), 1e-3)
    assert not same.beyond and same.note is None and same.max_abs == 0.0
    assert not point_diff("layers.2.mlp.router", ref, cand, 1e-3).beyond  # an activation: within tolerance


def test_an_op_one_arm_did_not_give_is_named_beside_the_first_op_beyond():
    ops = (PointDiff("layers.1.attn.q_proj", 0.0, 0.0, 1.0, 1.0), PointDiff("layers.1.attn.q_rope", note="absent on the candidate"),
           PointDiff("layers.1.attn.core", 1.0, 0.5, 0.5, 1.0, beyond=True))
    loc = Localization("p", (1,), (PointDiff("layers.1.attn", 1.0, 0.5, 0.5, 1.0, beyond=True),), "layers.1.attn", 1e-3,
                       "r", "c", ops=ops)
    assert loc.ops_not_compared == ("layers.1.attn.q_rope",)
    assert "first op beyond: layers.1.attn.core (or earlier, not compared: layers.1.attn.q_rope)" in text_lines(loc)[0]
    assert loc.to_json()["ops_not_compared"] == ["layers.1.attn.q_rope"]


def test_tolerance_by_dtype_pair():
    assert default_tolerance("float32", "float32") == 1e-10
    assert default_tolerance("bfloat16", "float32") == default_tolerance("float32", "bfloat16") == 1e-3
    assert default_tolerance("q8_0", None) == 1e-3


def config(**top):
    return parse_gate_config(gate_text(prompts="p.jsonl", reference={"kind": "hf", "model": "m"},
                                       candidate={"kind": "hf", "model": "m"}, **top), "g.toml")


def localize_of(**top):
    """The parsed `localize` settings, as the localize folder reads them back from the gate config."""
    return localize_settings(config(**top))


def test_localize_config_forms():
    assert localize_of() is None and localize_of(localize=False) is None
    assert localize_of(localize=True).scope == Scope.DIVERGENT
    assert localize_of(localize="all").scope == Scope.ALL
    lc = localize_of(localize={"include": "all", "positions": 3, "tolerance": 1e-6, "points": ["embed", "logits"],
                               "reference": {"kind": "hf", "model": "other"}})
    assert lc.settings.positions == 3 and lc.settings.points == ("embed", "logits") and lc.reference.kind == "hf"


@pytest.mark.parametrize(("value", "words"), [
    (3, "localize must be true, false"),
    ({"tolerance": 5}, "tolerance"),
    ({"points": ["layers.x"]}, "unknown point name"),
    ({"positons": 3}, "did you mean"),
])
def test_a_bad_localize_config_is_a_config_error(value, words):
    with pytest.raises(ConfigError, match=words):
        config(localize=value)


def test_text_and_svg_of_a_localisation():
    loc = Localization("p", (3, 4), (PointDiff("embed", 0.0, 0.0, 1.0, 1.0), PointDiff("layers.0.attn", 0.1, 1e-4, 0.9,
                       1.0, beyond=True)), "layers.0.attn", 1e-5, "hf a", "hf b")
    assert restore.localization(written(loc.to_json(), LocalizationDoc)) == loc  # declared once: written and read
    assert text_lines(loc)[0].startswith("first beyond tolerance: layers.0.attn")
    svg = svg_curve(loc)
    assert svg.startswith("<svg") and "tolerance 1e-05" in svg
