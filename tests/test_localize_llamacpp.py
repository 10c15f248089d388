"""llama.cpp (examples/engines/llamacpp_engine.py, cb_eval) against hf float32, the bundled model:
F32 within a float32 tolerance at every point, an f16 KV cache first beyond it at an attention
point, Q8_0 beyond it from the first layer on. Skips without .venvs/llamacpp and the GGUF files
(fails under CI), as tests/test_llamacpp_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import need
from test_llamacpp_engine import ADAPTER, GGUF, ROOT, VENV_PY, need_llamacpp

from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.localize.run import Settings, Target, localize

need("transformers")
pytestmark = pytest.mark.slow
IDS = tuple([1] + [(29 * j + 7) % 1000 + 4 for j in range(40)])
FP32 = 1e-10  # the float32 default (docs/localize.md); llama.cpp's hello states no dtype


def run(tmp_path: Path, gguf: str, *extra: str):
    need_llamacpp()
    cand = CommandEngine(CommandOptions(command=[str(VENV_PY), str(ADAPTER), "--model", str(GGUF[gguf]),
                                                 "--threads", "1", *extra]), base_dir=ROOT)
    t = Target("p", IDS, tuple(range(len(IDS) - 8, len(IDS))))
    loc = localize([t], HFEngine(HFOptions(model="bundled:tiny-llama")), cand, tmp_path / "w",
                   Settings(tolerance=FP32), release=lambda e: e.close())["p"]
    assert loc.error is None, loc.error
    assert not loc.grafted and cand.can_graft is False  # llama.cpp gives the accumulated curve only
    return loc


def test_f32_is_within_the_float32_tolerance_at_every_point(tmp_path):
    loc = run(tmp_path, "f32")
    given = [p.name for p in loc.points if p.note is None]
    assert given == ["layers.0.attn", "layers.0.mlp", "layers.0", "layers.1.attn", "layers.1.mlp", "layers.1",
                     "norm", "logits"]
    assert loc.first_beyond is None, [(p.name, p.rel_diff) for p in loc.points]


def test_an_f16_kv_cache_first_shows_at_an_attention_point(tmp_path):
    loc = run(tmp_path, "f32", "--kv-type", "f16")
    assert loc.first_beyond == "layers.0.attn", [(p.name, p.rel_diff) for p in loc.points]


def test_q8_0_is_beyond_from_the_first_layer_on(tmp_path):
    loc = run(tmp_path, "q8_0")
    layered = [p for p in loc.points if p.name.startswith("layers.")]
    assert loc.first_beyond == "layers.0.attn" and all(p.beyond for p in layered)


def test_a_decode_path_dump_of_f32_is_within_the_float32_tolerance(tmp_path):
    """`"mode": "decode"`: the prompt as one batch, then one-token batches through the KV cache.
    An honest F32 engine's decode path agrees with hf's prefill at every point it gives."""
    from strict_gate.engines.base import DumpRequest
    from strict_gate.localize.capture import capture
    from strict_gate.localize.compare import compare_points

    need_llamacpp()
    cand = CommandEngine(CommandOptions(command=[str(VENV_PY), str(ADAPTER), "--model", str(GGUF["f32"]),
                                                 "--threads", "1"]), base_dir=ROOT)
    ref = HFEngine(HFOptions(model="bundled:tiny-llama"))
    pos = tuple(range(len(IDS) - 8, len(IDS)))
    try:
        r = capture(ref, DumpRequest(IDS, None, pos, tmp_path / "r")).tensors
        c = capture(cand, DumpRequest(IDS, None, pos, tmp_path / "c", decode_from=len(IDS) - 6)).tensors
    finally:
        cand.close()
        ref.close()
    assert cand.can_dump_decode
    points = compare_points(r, c, FP32)
    given = [p for p in points if p.note is None]
    assert len(given) == 8 and not any(p.beyond for p in given), [(p.name, p.rel_diff) for p in points]
