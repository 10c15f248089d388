"""The parts of localisation that need no model: the comparison's invariants, the point names,
the config, and a report's localisation in every format (no torch for the formats)."""

from __future__ import annotations

import pytest
from helpers import gate_text
from hypothesis import given, settings
from hypothesis import strategies as st

from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.config import parse_gate_config
from strict_gate.gate.localize_config import Scope
from strict_gate.judge.localization import Localization, PointDiff
from strict_gate.localize.points import in_depth_order, parse_points
from strict_gate.report.localization import svg_curve, text_lines

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


def test_tolerance_by_dtype_pair():
    assert default_tolerance("float32", "float32") == 1e-10
    assert default_tolerance("bfloat16", "float32") == default_tolerance("float32", "bfloat16") == 1e-3
    assert default_tolerance("q8_0", None) == 1e-3


def config(**top):
    return parse_gate_config(gate_text(prompts="p.jsonl", reference={"kind": "hf", "model": "m"},
                                       candidate={"kind": "hf", "model": "m"}, **top), "g.toml")


def test_localize_config_forms():
    assert config().localize is None and config(localize=False).localize is None
    assert config(localize=True).localize.scope == Scope.DIVERGENT
    assert config(localize="all").localize.scope == Scope.ALL
    lc = config(localize={"include": "all", "positions": 3, "tolerance": 1e-6, "points": ["embed", "logits"],
                          "reference": {"kind": "hf", "model": "other"}}).localize
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
    assert Localization.from_json(loc.to_json()) == loc
    assert text_lines(loc)[0].startswith("first beyond tolerance: layers.0.attn")
    svg = svg_curve(loc)
    assert svg.startswith("<svg") and "tolerance 1e-05" in svg
