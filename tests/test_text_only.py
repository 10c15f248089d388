"""Text-only arms in parts (issue 30): the openai engine in text_only mode against the tests'
fake server (its text-only mode; the bundled model's real tokenizer), the run format's
"text_only" object, the comparator's text-level match and the one-sided policy's rule.
The gates as a user runs them are in test_adversarial_text_only.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engines.fake_openai_server import Mode
from helpers import confident, rec, write_run

from strict_gate.engines.base import PromptInput
from strict_gate.engines.openai.engine import OpenAIEngine, OpenAIOptions
from strict_gate.engines.openai.text_only import in_context
from strict_gate.errors import ConfigError, InputError
from strict_gate.judge.compare import Status, compare_prompt
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.diagnose import Diagnosis, ScoredPosition
from strict_gate.judge.policies.near_tie_reference_only import ONE_SIDED, reference_only
from strict_gate.judge.policy import Policy, apply_policy
from strict_gate.runs.reader import _fast, load_run
from strict_gate.runs.records import Record, Sampling, TextReply

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
BASELINE = ROOT / "baselines" / "tiny-llama-vllm-fp32"
TEXTS = [json.loads(x) for x in (ROOT / "prompts" / "battery-128.jsonl").read_text().splitlines()[:3]]


def _engine(srv, **opts) -> OpenAIEngine:
    return OpenAIEngine(OpenAIOptions(base_url=srv.url, text_only=True, tokenizer=str(MODEL), retries=0, **opts))


def _inputs(eng: OpenAIEngine) -> list[PromptInput]:
    return [PromptInput(p["id"], tuple(eng.tokenize(p["text"])), p["text"]) for p in TEXTS]


def _server(fake_openai, **b):
    return fake_openai(Mode.TEXT_ONLY, tokenizer=MODEL / "tokenizer.json", replay=BASELINE / "records.jsonl", **b)


# ---------------------------------------------------------------- the engine


def test_text_is_sent_and_the_reply_is_tokenized_in_context(fake_openai):
    srv = _server(fake_openai, tokenize=True)
    eng = _engine(srv)
    recs = list(eng.generate(_inputs(eng), Sampling(16, 5)))
    baseline = {r.id: r for r in load_run(BASELINE).records.values()}
    for r in recs:
        assert r.error is None and r.top_logprobs is None and r.text_only is not None
        assert r.text_only.usage_prompt_tokens == len(r.prompt_token_ids) == len(r.text_only.server_prompt_token_ids)
        assert r.token_ids == baseline[r.id].token_ids  # these three re-tokenize to vLLM's own ids
    bodies = [p for p in srv.posts]
    assert all(isinstance(b["prompt"], str) and "logprobs" not in b for b in bodies)
    assert bodies[0]["prompt"] == bodies[1]["prompt"] and len(bodies) == 4  # the first prompt twice
    assert not eng.can_score


def test_streamed_text_gives_a_first_delta_time_and_the_same_record(fake_openai):
    srv = _server(fake_openai)
    eng = _engine(srv, stream_timing=True)
    p = _inputs(eng)[1]
    seen: list[int] = []
    r = eng.stream_one(p, Sampling(16, 5), seen.append)
    assert r.error is None and r.timing.ttft_s is not None and r.timing.ttft_s <= r.timing.total_s
    assert len(seen) == 16 and r.text_only.usage_completion_tokens == 16
    assert srv.posts[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("faults", "words"), [
    ({"flaky": True}, "same prompt twice (greedy) with different text"),
    ({"usage": False}, "states no usage.prompt_tokens"),
    ({"overrun": 2}, "generated 18 tokens (usage.completion_tokens) with max_tokens 16"),
])
def test_a_reply_that_cannot_be_trusted_is_an_error_record(fake_openai, faults, words):
    srv = _server(fake_openai, **faults)
    eng = _engine(srv)
    first = next(iter(eng.generate(_inputs(eng)[:1], Sampling(16, 5))))
    assert first.error is not None and words in first.error, first.error


def test_a_text_only_arm_needs_a_tokenizer():
    with pytest.raises(ConfigError, match="text_only = true needs tokenizer"):
        OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:1", text_only=True))


def test_a_reply_that_merges_with_the_prompt_is_said_so():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    ok = in_context(tok, "Once upon a", " time")
    assert ok.problem is None and ok.prompt_ids == tuple(tok.encode("Once upon a").ids)
    # "\n" + "\n  x": the tokenizer merges the prompt's last token with the reply; the reply
    # tokenized alone decodes after the prompt to the very same text, so it is taken
    merged = in_context(tok, "def f():\n", "\n  x")
    assert tuple(tok.encode("def f():\n\n  x").ids)[: len(merged.prompt_ids)] != merged.prompt_ids
    assert merged.problem is None and merged.continuation == tuple(tok.encode("\n  x", add_special_tokens=False).ids)


# ---------------------------------------------------------------- the run format


def _text_rec(pid="a", tokens=(5, 6), text=" x y", fed=3, made=2, ids=None) -> Record:
    return Record(id=pid, prompt_token_ids=(1, 2, 3), token_ids=tuple(tokens), finish_reason="length",
                  text_only=TextReply(text, fed, made, ids))


def test_the_text_only_object_is_written_and_read_back(tmp_path):
    r = _text_rec(ids=(1, 2, 3))
    run = load_run(write_run(tmp_path / "run", [r], max_tokens=2))
    assert run.records["a"].text_only == r.text_only and run.records["a"].top_logprobs is None
    fast = _fast(tmp_path / "run" / "records.jsonl")  # the pyarrow path keeps it too
    assert fast is not None and fast.raws[0].text_only.usage_prompt_tokens == 3


def test_a_text_only_record_claiming_logprobs_or_a_length_it_did_not_reach_is_refused(tmp_path):
    bad = Record(id="a", prompt_token_ids=(1,), token_ids=(5,), finish_reason="length",
                 top_logprobs=(confident(5),), text_only=TextReply("x", 1, 1))
    with pytest.raises(InputError, match="rule text-only"):
        load_run(write_run(tmp_path / "r1", [bad], max_tokens=1))
    short = _text_rec(made=1)
    with pytest.raises(InputError, match='"length" after 1 generated tokens'):
        load_run(write_run(tmp_path / "r2", [short], max_tokens=2))


# ---------------------------------------------------------------- the comparator and the policy


@pytest.mark.parametrize(("fed", "ids", "words"), [
    (1, None, "ignored or truncated the prompt"),
    (4, None, "such as a second BOS"),
    (2, None, "such as the BOS"),
    (3, (1, 1, 2), "/tokenize of the prompt text differs from the prompt's ids at index 1"),
])
def test_the_servers_own_prompt_figures_are_checked(fed, ids, words):
    pc = compare_prompt("a", rec("a", (5, 6)), _text_rec(fed=fed, ids=ids), 0.5)
    assert pc.status == Status.TOKENIZATION_MISMATCH and words in pc.detail


def test_equal_text_is_a_text_level_match_and_other_text_a_divergence_of_unknown_candidate_gap():
    ref = rec("a", (5, 6, 7), finish="length")
    same_text = _text_rec(tokens=(5, 9), text=" five six seven")  # another split of the same text
    decode = lambda prompt, cont: " five six seven" if tuple(cont) == (5, 6, 7) else "?"  # noqa: E731
    pc = compare_prompt("a", ref, same_text, 0.5, decode=decode)
    assert pc.status == Status.MATCH and "text-level" in pc.detail
    other = _text_rec(tokens=(5, 8, 7), text=" five eight seven")
    pc = compare_prompt("a", ref, other, 0.5, decode=decode)
    assert pc.status == Status.DIVERGENT and pc.first_divergence.position == 1
    assert "candidate gap unknown: text-only server" in pc.first_divergence.reason
    assert compare_prompt("a", ref, same_text, 0.5).status == Status.DIVERGENT  # no tokenizer: ids only


def _diagnosis(gaps: dict[int, float | None]) -> Diagnosis:
    steps = tuple(ScoredPosition(i, 8, g, 6) for i, g in gaps.items())
    return Diagnosis("a", min(gaps), None, steps[0].gap, 6, False, (), steps, "")


def test_the_one_sided_rule_reads_the_reference_gap_at_the_divergence_and_every_later_position():
    pc = compare_prompt("a", rec("a", (5, 6, 7), finish="length"), _text_rec(tokens=(5, 8, 7)), 0.5)
    ok, why = reference_only(pc, _diagnosis({1: 0.3, 2: 0.0}), 0.5)
    assert ok and "reference gap 0.3 <= band 0.5" in why and "not known" in why
    ok, why = reference_only(pc, _diagnosis({1: 0.3, 2: 0.9}), 0.5)
    assert not ok and "at a later position 2" in why and "|gap| 0.9000 > band 0.5" in why, why
    ok, why = reference_only(pc, _diagnosis({1: 0.7, 2: 0.0}), 0.5)
    assert not ok and "reference gap 0.7000 > band 0.5 at position 1 (the first divergence" in why, why
    ok, why = reference_only(pc, _diagnosis({1: None, 2: 0.0}), 0.5)
    assert not ok and "outside the reference's top-k" in why
    ok, why = reference_only(pc, _diagnosis({1: 0.3}), 0.5)
    assert not ok and "position 2 after the flip not judged: the reference re-scored 2 of 3 positions" in why, why
    ok, why = reference_only(pc, None, 0.5)
    assert not ok and "not re-scored" in why


def test_the_one_sided_policy_passes_a_flip_two_sided_fails_and_says_it_is_weaker():
    ref, cand = {"a": rec("a", (5, 6, 7), finish="length")}, {"a": _text_rec(tokens=(5, 8, 7))}
    comparison = compare_runs(ref, cand, band=0.5)
    dg = {"a": _diagnosis({1: 0.3, 2: 0.0})}
    one = apply_policy(comparison, Policy.NEAR_TIE_REFERENCE_ONLY, ref, cand, diagnoses=dg)
    two = apply_policy(comparison, Policy.NEAR_TIE, ref, cand, diagnoses=dg)
    assert one.verdict == "pass" and two.verdict == "fail"
    assert ONE_SIDED in one.policy_words and ONE_SIDED in one.notes[0]
    assert two.policy_words == "near-tie"


# ---------------------------------------------------------------- the speed arm


def test_ladder_text_prompts_have_the_rungs_length_in_tokens():
    from tokenizers import Tokenizer

    from strict_gate.speed.text_prompts import text_space

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    space = text_space(MODEL / "tokenizer.json", [p["text"] for p in TEXTS])
    for n in (8, 32, 100):
        ids, text = space.draw(f"seed-{n}", n)
        assert tuple(tok.encode(text).ids) == ids and abs(len(ids) - n) <= 1, (n, len(ids), text)
        assert space.draw(f"seed-{n}", n) == (ids, text)  # seeded: both arms get the same prompt


def test_a_text_only_arm_is_timed_on_text_prompts_from_streamed_deltas(fake_openai):
    """Both arms text-only servers of the same fake model: every rung's prompts are text, the
    TTFT comes from the first text delta, the token count from tokenizing the reply, and the
    replies verify against each other by their text."""
    from strict_gate.speed.bench import SpeedSession
    from strict_gate.speed.config import SpeedConfig, TokenRules, parse_rung

    a, b = _server(fake_openai), _server(fake_openai)
    engines = {"reference": _engine(a), "candidate": _engine(b)}
    cfg = SpeedConfig(warmup=0, runs=2, rungs=(parse_rung("24/8"), parse_rung("gate")))
    session = SpeedSession(cfg, 16, _inputs(engines["reference"]), engines, TokenRules(5, 0.5, 1e-3))
    for role, eng in engines.items():
        session.measure(role, eng)
    result = session.result()
    assert not session.failed, session.failed
    assert result.method.value == "stream"
    for rung in result.rungs:
        assert rung.error is None and rung.token_check.verified is True, rung
        assert rung.candidate.ttft_s.samples and rung.candidate.decode_tok_s.samples
    ladder = [p for p in b.posts if p["max_tokens"] == 8]
    assert ladder and all(isinstance(p["prompt"], str) and p["stream"] for p in ladder)
    # the reply tokenized in context: near the server's 8 tokens, not always on them (a merge of
    # two generated pieces is one token of the text: the method's limit, docs/engine-protocol.md)
    assert 6 <= result.rungs[0].candidate.tokens <= 9


def test_a_text_only_reply_is_split_as_the_reference_would_before_it_is_re_scored():
    """vLLM's bf16 server answered list-009 with "   jurisdictions...": the tokenizer makes "  " +
    " j..." of the three spaces, the model (its fp32 baseline too) emits three single spaces.
    Re-scored on the tokenizer's split the reference put the first token 11.7 nats below its
    argmax (a false divergence at position 0, seen in benchmarks/README.md); walked along the
    reference's own choices, the same text starts with the model's three spaces and the real
    difference is found where the text differs."""
    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.judge.resplit import resplit
    from strict_gate.judge.text_only import decoder, speller

    ref = load_run(BASELINE).records["list-009"]
    decode = decoder(MODEL / "tokenizer.json")
    text = "   jurisdictions do not allow the exclu"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    prompt_text = next(json.loads(x)["text"] for x in (ROOT / "prompts" / "battery-128.jsonl").read_text().splitlines()
                       if json.loads(x)["id"] == "list-009")
    placed = in_context(tok, prompt_text, text)
    cand = Record(id="list-009", prompt_token_ids=placed.prompt_ids, token_ids=placed.continuation,
                  finish_reason="length", text_only=TextReply(text, len(placed.prompt_ids), 16))
    assert cand.prompt_token_ids == ref.prompt_token_ids and cand.token_ids[0] != ref.token_ids[0]
    comparison = compare_runs({"list-009": ref}, {"list-009": cand}, band=0.5, decode=decode)
    assert comparison.prompts[0].first_divergence.position == 0
    hf = HFEngine(HFOptions(model="bundled:tiny-llama", dtype="float32"), base_dir=ROOT)
    try:
        hf.start()
        again, records, n = resplit(comparison, {"list-009": ref}, {"list-009": cand}, hf.score, 5, decode,
                                    speller(MODEL / "tokenizer.json"), band=0.5, greedy_tolerance=1e-3)
    finally:
        hf.close()
    walked = records["list-009"]
    assert n == 1 and walked.token_ids[:3] == ref.token_ids[:3] and decode(walked.prompt_token_ids,
                                                                            walked.token_ids) == text
    assert again.prompts[0].first_divergence.position >= 3
