"""Localise what the gate saw: decode-only bugs, found along the decode path (issue 27).

A decode-only bug leaves prefill, score and a prefill dump honest; only the path generate takes
(a cache, a recurrent state) is wrong. Each arm's prefill dump is checked to choose the token that
arm generated; the candidate's does not, so its decode-path dump (a prefill of the prompt, then
the common prefix one id at a time through its cache) is compared instead, against the
reference's decode-path dump (both arms along one path), and must name the planted layer. Planted bugs: an hf KV-cache bug (from decode step K, layer L's cached value of
newest, zeroed), and a recurrent-state bug in the KDA example (tests/engines/kda_state_bug.py).
The planting is a hook on the real engine's model: the engines, models and paths are real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import need

from strict_gate.core.model_files import resolve_model
from strict_gate.engines.base import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.judge.localization import Alone
from strict_gate.localize.run import Settings, localize, target
from strict_gate.runs.records import Sampling

need("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
KDA_MODEL = ROOT / "examples/models/tiny-kimi-linear"
PROMPTS = [PromptInput(f"p{i}", tuple([1] + [(29 * j + 7 + 13 * i) % 1000 + 4 for j in range(20)])) for i in range(4)]


def plant_kv_bug(engine: HFEngine, layer: int, step: int) -> None:
    """From decode step `step` on, layer `layer`'s cached values (all but the newest) are zeroed."""
    engine.start()
    seen = {"n": 0}

    def hook(module, args, kwargs, out):
        cache, x = kwargs.get("past_key_values"), kwargs.get("hidden_states")
        if cache is None or x is None:
            return
        seen["n"] = seen["n"] + 1 if x.shape[1] == 1 else 0
        if seen["n"] >= step:
            cache.layers[layer].values[:, :, :-1, :] = 0

    engine._model.model.layers[layer].self_attn.register_forward_hook(hook, with_kwargs=True)


def divergent_targets(reference, candidate, n: int = 8):
    sampling = Sampling(max_tokens=12, top_logprobs=1)
    refs = {r.id: r for r in reference.generate(PROMPTS, sampling)}
    out = []
    for c in candidate.generate(PROMPTS, sampling):
        r = refs[c.id]
        d = next((i for i, (a, b) in enumerate(zip(r.token_ids, c.token_ids)) if a != b), None)
        if d is not None:
            out.append(target(c.id, r, d, n, (r.token_ids[d], c.token_ids[d])))
    assert out, "the planted bug changed no token: nothing to localise"
    return out


def check_decode_localised(locs, planted: str) -> None:
    for loc in locs.values():
        assert loc.error is None, loc.error
        by_arm = {r.arm: r for r in loc.reproduction}
        # the candidate's decode-path dump is compared: the reference dumps along its decode path too
        assert by_arm["reference"].reproduced and by_arm["reference"].path == "decode"
        assert by_arm["candidate"].reproduced and by_arm["candidate"].path == "decode", by_arm
        assert loc.first_beyond == planted, [(p.name, p.rel_diff) for p in loc.points]


def test_hf_kv_cache_bug_is_localised_along_the_decode_path(tmp_path):
    src = str(resolve_model("bundled:tiny-llama", ROOT))
    reference, candidate = HFEngine(HFOptions(model=src)), HFEngine(HFOptions(model=src))
    plant_kv_bug(candidate, layer=1, step=2)
    ts = divergent_targets(reference, candidate)
    locs = localize(ts, reference, candidate, tmp_path / "work", Settings(), release=lambda e: None)
    check_decode_localised(locs, "layers.1.attn")
    for loc in locs.values():  # narrowed along the decode path, and grafted at ops along it (issue 27)
        assert loc.first_beyond_op == "layers.1.attn.core", [(p.name, p.rel_diff) for p in loc.ops]
        assert loc.verdict("layers.1.attn.core") is Alone.WRONG, (loc.alone, loc.op_graft_note)
        assert not [op for op, v in loc.alone if v is Alone.WRONG and op != "layers.1.attn.core"], loc.alone
    reference.close()
    candidate.close()


def test_kda_recurrent_state_bug_is_localised_along_the_decode_path(tmp_path):
    reference = HFEngine(HFOptions(model=str(KDA_MODEL), threads=1))
    candidate = CommandEngine(
        CommandOptions(command=[sys.executable, str(ROOT / "tests/engines/kda_state_bug.py"), "--model",
                                str(KDA_MODEL), "--dtype", "float32"], timeout_s=300, startup_timeout_s=300),
        env={"DEVICE_KDA": "1", "KDA_CHUNK_PREFILL": "1", "KDA_THREADS": "1", "KDA_STATE_BUG": "1:2"},
        base_dir=ROOT)
    try:
        ts = divergent_targets(reference, candidate)
        locs = localize(ts, reference, candidate, tmp_path / "work", Settings(), release=lambda e: None)
        check_decode_localised(locs, "layers.1.attn")
    finally:
        reference.close()
        candidate.close()
