"""Grafting at ops and the decode dump's check, on hand-made tensors (no engine): the verdicts,
the refusal of an ignored graft, a decode dump whose prefill rows are not its own prefill's, and
the mode's parsing. The same paths run on real engines in tests/test_localize_ops.py and
tests/test_adversarial_localize_decode.py."""

from __future__ import annotations

import msgspec
import pytest

from strict_gate.errors import InputError
from strict_gate.judge import restore
from strict_gate.judge.localization import Alone, Localization, PointDiff
from strict_gate.judge.schema import LocalizationDoc
from strict_gate.localize.arm import DumpMode, parse_mode
from strict_gate.localize.graft import ignored, inputs_of, verdicts
from strict_gate.localize.reproduce import decode_mismatch

torch = pytest.importorskip("torch")


def diff(name: str, beyond: bool, rel: float = 0.0) -> PointDiff:
    return PointDiff(name, max_abs=rel, rel_diff=rel, beyond=beyond)


def test_what_an_op_reads():
    assert inputs_of("layers.3.mlp.down_proj") == ("layers.3.mlp.act",)
    assert inputs_of("layers.0.attn_norm") == ("embed",)
    assert inputs_of("layers.2.mlp_norm") == ("layers.1", "layers.2.attn.o_proj")
    assert inputs_of("layers.2.mlp.experts") == ()  # not an op this module knows: no verdict


def test_verdicts_wrong_alone_follows_and_unjudged():
    ops = (diff("layers.1.mlp.up_proj", True), diff("layers.1.mlp.act", True), diff("layers.1.mlp.down_proj", True))
    fed = (diff("layers.1.mlp.up_proj", True), diff("layers.1.mlp.act", False), diff("layers.1.mlp.down_proj", False))
    gave = {"layers.1.mlp_norm", "layers.1.mlp.up_proj", "layers.1.mlp.act", "layers.1.mlp.down_proj"}
    assert dict(verdicts(ops, fed, gave, gave)) == {"layers.1.mlp.up_proj": Alone.WRONG,
                                                    "layers.1.mlp.act": Alone.FOLLOWS,
                                                    "layers.1.mlp.down_proj": Alone.FOLLOWS}
    # the candidate does not give mlp.act: down_proj could not be fed it, so no verdict
    assert "layers.1.mlp.down_proj" not in dict(verdicts(ops, fed, gave, gave - {"layers.1.mlp.act"}))


def test_an_ignored_graft_is_named():
    own = {"layers.1.mlp.act": torch.ones(2, 3), "layers.1.mlp.down_proj": torch.ones(2, 3)}
    diffs = {"layers.1.mlp.up_proj": diff("layers.1.mlp.up_proj", True, 0.1)}
    why = ignored(own, dict(own), diffs)
    assert why is not None and "layers.1.mlp.act" in why and "layers.1.mlp.up_proj" in why
    honest = {k: v * 0.9 for k, v in own.items()}
    assert ignored(own, honest, diffs) is None
    # inputs within tolerance: the same value back is no evidence of anything
    assert ignored(own, dict(own), {"layers.1.mlp.up_proj": diff("layers.1.mlp.up_proj", False, 1e-12)}) is None


def test_a_decode_dump_is_checked_against_its_own_prefill_rows():
    prefill = {"layers.0": torch.arange(12.0).reshape(4, 3)}
    honest = {"layers.0": prefill["layers.0"].clone()}
    honest["layers.0"][3] += 5  # the decode rows may differ (a decode-only bug): not checked
    assert decode_mismatch(prefill, honest, (4, 5, 6, 7), 7, 1e-10) is None
    shifted = {"layers.0": prefill["layers.0"].roll(1, 0)}
    assert "decode_from ignored" in (decode_mismatch(prefill, shifted, (4, 5, 6, 7), 7, 1e-10) or "")
    assert "lacks layers.0" in (decode_mismatch(prefill, {}, (4, 5, 6, 7), 7, 1e-10) or "")


def test_the_mode_and_its_bad_values():
    assert parse_mode("both") is DumpMode.BOTH
    with pytest.raises(InputError, match="--mode: 'sideways' is not a dump mode"):
        parse_mode("sideways")


def test_both_paths_round_trip_through_json():
    inner = Localization("p", (1,), (diff("layers.0", True, 0.5),), "layers.0", 1e-10, "r", "c", dump_mode="decode")
    outer = Localization("p", (1,), (diff("layers.0", False),), None, 1e-10, "r", "c", dump_mode="both",
                         decode=inner, alone=(("layers.0.mlp.act", Alone.FOLLOWS),))
    back = restore.localization(msgspec.convert(outer.to_json(), LocalizationDoc))
    assert back == outer and back.decode is not None and back.decode.first_beyond == "layers.0"
