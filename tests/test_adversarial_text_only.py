"""Text-only servers gated as a user gates one (issue 30): the tests' fake OpenAI server in its
text-only mode (prompt as text, text back, usage, no ids, no logprobs) as the candidate, the
committed vLLM fp32 baseline as the reference, the bundled model under transformers (float32)
as the [rescorer]; a gate TOML in a temporary directory, run from there through the CLI with
relative paths.

The fake server is a stand-in for vllm.cpp's server (which cannot be built in a test): it
answers the baseline's own tokens as text, or breaks the way text-only servers do.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from engines.fake_openai_server import Mode
from helpers import write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "baselines" / "tiny-llama-vllm-fp32"
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
runner = CliRunner()


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A user's directory: the prompt set, the baseline and the model's tokenizer beside the gate."""
    shutil.copy(ROOT / "prompts" / "battery-128.jsonl", tmp_path / "prompts.jsonl")
    shutil.copytree(BASELINE, tmp_path / "baseline")
    (tmp_path / "tokenizer").mkdir()
    shutil.copy(MODEL / "tokenizer.json", tmp_path / "tokenizer" / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _server(fake_openai, **faults):
    return fake_openai(Mode.TEXT_ONLY, tokenizer=MODEL / "tokenizer.json", replay=BASELINE / "records.jsonl", **faults)


def _gate(where: Path, url: str, *, policy: str = "near-tie", prompts: str = "prompts.jsonl", **arm) -> Path:
    return write_gate(
        where, name="text-only", prompts=prompts, max_tokens=16, top_logprobs=5, policy=policy, band=0.5,
        output_dir="reports",
        reference={"kind": "recorded", "path": "baseline", "model": "bundled:tiny-llama"},
        candidate={"kind": "openai", "base_url": url, "text_only": True, "tokenizer": "tokenizer", "retries": 0,
                   **arm},
        rescorer={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"},
    )


def _report(where: Path) -> dict:
    (report,) = (where / "reports").glob("text-only-*/report.json")
    return json.loads(report.read_text())


def test_an_honest_text_only_server_passes_at_text_level(user_dir, fake_openai):
    srv = _server(fake_openai, tokenize=True)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url))])
    assert r.exit_code == 0, r.output
    rep = _report(user_dir)
    assert rep["verdict"] == "pass" and rep["summary"]["prompts_exact"] == 128
    details = [p["detail"] for p in rep["prompts"]]
    assert all("text-level" in x for x in details), details[:3]
    note = next(n for n in rep["notes"] if "text-only server" in n)
    moved = sum(1 for p in rep["prompts"] if p["matched_positions"] != p["reference_length"]
                or p["reference_length"] != p["candidate_length"])
    assert moved > 0  # greedy ids of the baseline that are not what the tokenizer makes of their text
    assert f"128 prompt(s) matched at text level, {moved} of them with other token ids" in note, note
    records = [json.loads(x) for x in next((user_dir / "reports").glob("*/candidate/records.jsonl")).read_text().splitlines()]
    assert all(x["text_only"]["usage_prompt_tokens"] == len(x["prompt_token_ids"]) for x in records)
    assert all(x["top_logprobs"] is None for x in records)
    assert any(srv_post["prompt"] == srv.posts[1]["prompt"] for srv_post in srv.posts[:1])  # the first prompt twice
    assert all(isinstance(p["prompt"], str) for p in srv.posts)


def test_a_server_that_ignores_the_prompt_is_caught_by_usage(user_dir, fake_openai):
    srv = _server(fake_openai, ignore_prompt=True)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url))])
    assert r.exit_code == 1, r.output
    rep = _report(user_dir)
    assert rep["summary"]["counts"]["tokenization_mismatch"] == 128
    reason = rep["prompts"][0]["reason"]
    assert "usage.prompt_tokens" in reason and "ignored or truncated the prompt" in reason, reason


def test_a_bos_added_twice_is_a_tokenization_mismatch(user_dir, fake_openai):
    srv = _server(fake_openai, double_bos=True, tokenize=True)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url))])
    assert r.exit_code == 1, r.output
    rep = _report(user_dir)
    assert rep["summary"]["counts"]["tokenization_mismatch"] == 128
    reason = rep["prompts"][0]["reason"]
    assert "tokenization mismatch" in reason and "second BOS" in reason, reason


@pytest.mark.parametrize("policy", ["near-tie", "near-tie-reference-only"])
def test_text_going_wrong_after_a_few_tokens_fails_naming_the_position_and_the_reference_gap(
        user_dir, fake_openai, policy):
    srv = _server(fake_openai, wrong_at=3, wrong_prompts=3)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url, policy=policy))])
    assert r.exit_code == 1, r.output
    rep = _report(user_dir)
    first = rep["prompts"][0]
    assert first["status"] == "divergent", first
    reason = first["reason"]
    assert "position 3" in reason, reason
    assert rep["summary"]["counts"]["divergent"] == 3 and rep["summary"]["counts"]["match"] == 125
    dg = first["diagnosis"]
    assert dg["position"] == 3 and dg["rescored_gap"] is not None and dg["rescored_gap"] > 0.5
    if policy == "near-tie":
        assert "candidate gap unknown: text-only server" in reason and "reference re-scored |gap|" in reason
    else:
        assert "one-sided: reference gap" in reason and "> band 0.5 at position 3" in reason, reason
        assert "one-sided and weaker" in r.output  # the console's verdict line says what the policy is
        out = next((user_dir / "reports").glob("text-only-*"))
        for name in ("report.md", "report.html", "junit.xml"):  # every format says what the policy is
            assert "one-sided and weaker" in (out / name).read_text(), name
        assert any("one-sided and weaker" in n for n in rep["notes"])
        show = runner.invoke(app, ["show", str(out)])
        assert "one-sided and weaker" in show.output, show.output


def test_a_prompt_set_of_token_ids_is_refused_for_a_text_only_arm(user_dir, fake_openai):
    srv = _server(fake_openai)
    Path("ids.jsonl").write_text(json.dumps({"id": "a", "token_ids": [1, 50, 81]}) + "\n")
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url, prompts="ids.jsonl"))])
    assert r.exit_code == 2, r.output
    assert "text_only = true sends each prompt as text" in r.output and "ids.jsonl" in r.output
    assert not srv.posts


def test_a_text_only_arm_without_a_tokenizer_is_refused_at_its_line(user_dir, fake_openai):
    srv = _server(fake_openai)
    gate = _gate(Path("."), srv.url)
    gate.write_text(gate.read_text().replace('tokenizer = "tokenizer"\n', ""))
    r = runner.invoke(app, ["gate", str(gate)])
    assert r.exit_code == 2, r.output
    assert "text_only = true needs tokenizer" in r.output and "gate.toml:" in r.output


@pytest.mark.parametrize(("faults", "code", "words"), [
    ({"tokenize": True}, 0, "usage.prompt_tokens and /tokenize agree"),
    ({"ignore_prompt": True}, 1, "ignored or truncated the prompt"),
    ({"flaky": True}, 1, "same prompt twice (greedy) with different text"),
])
def test_check_engine_checks_what_a_text_only_server_states(user_dir, fake_openai, faults, code, words):
    srv = _server(fake_openai, **faults)
    Path("engine.toml").write_text(f'kind = "openai"\nbase_url = "{srv.url}"\ntext_only = true\n'
                                   'tokenizer = "tokenizer"\nretries = 0\n')
    r = runner.invoke(app, ["check-engine", "engine.toml"])
    assert r.exit_code == code, r.output
    assert words in r.output, r.output
    assert "speaks HTTP" in r.output and "the hello" not in r.output and "not declared" not in r.output, r.output
    if code == 0:
        assert "server-sent events" in r.output and "text deltas" in r.output


# ---- issue 36: text that re-tokenises to other ids, usage that lies, the one-sided policy named


@pytest.mark.parametrize("policy", ["strict", "auto"])
def test_text_that_re_tokenises_to_other_ids_is_never_a_strict_pass(user_dir, fake_openai, policy):
    """The honest server's text equals the reference's, but for some prompts it re-tokenises to
    other ids: strict (and auto, strict without samples) judges token for token, so those fail,
    named; the text-level match is no token-level one."""
    srv = _server(fake_openai, tokenize=True)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url, policy=policy))])
    assert r.exit_code == 1, r.output  # before: exit 0, every prompt a text-level "exact match"
    rep = _report(user_dir)
    moved = [p for p in rep["prompts"] if p["matched_positions"] != p["reference_length"]
             or p["reference_length"] != p["candidate_length"]]
    assert moved and all(not p["passed"] for p in moved)
    assert all(p["passed"] for p in rep["prompts"] if p not in moved)
    assert "its text re-tokenises to other ids than the reference's" in moved[0]["reason"], moved[0]["reason"]


def test_a_text_only_server_whose_usage_lies_is_never_a_strict_pass(user_dir, fake_openai):
    """code-006 stops on EOS; the server's text is the reference's, its usage says 3 more tokens
    than it generated: by its own count its ids are not the reference's, so strict fails it."""
    srv = _server(fake_openai, usage_lie=3)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url, policy="strict"))])
    assert r.exit_code == 1, r.output
    p = next(p for p in _report(user_dir)["prompts"] if p["id"] == "code-006")
    assert p["detail"].startswith("text-level") and not p["passed"]  # before: passed, a text-level match
    assert "usage.completion_tokens" in p["reason"] and "the reference generated" in p["reason"], p["reason"]


def test_the_one_sided_policy_is_named_in_every_format_of_a_passing_gate(user_dir, fake_openai):
    """A pass under near-tie-reference-only is the weaker, one-sided claim: md, html, junit, json
    (its verdict line and notes), show and the console say so, not only when it fails."""
    srv = _server(fake_openai, tokenize=True)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url, policy="near-tie-reference-only"))],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    out = next((user_dir / "reports").glob("text-only-*"))
    said = "one-sided and weaker"
    assert said in " ".join(r.output.split())
    for name in ("report.md", "report.html", "junit.xml"):
        assert said in (out / name).read_text(), name
    rep = _report(user_dir)
    assert rep["policy"] == "near-tie-reference-only" and any(said in n for n in rep["notes"])
    assert said in " ".join(runner.invoke(app, ["show", str(out)], terminal_width=200).output.split())


# ---- issue 50 item 7: a re-split is accepted only where it spells the reply's very bytes


def test_a_half_character_is_never_re_split_into_bytes_the_server_never_sent():
    """The reference ends " 👌" with a lone 0xF0 (a character it never finished); the server's text
    holds U+FFFD there (bytes EF BF BD), so the reply tokenizes to 'ï' '¿' '½'. Both "...👌" + 0xF0
    and "...👌" + 0xEF decode to " ok 👌�": walked along the reference's 0xF0 by text alone, the
    re-split glued the reply's '¿' '½' after it and a divergence was found at a token ('¿') the
    engine never emitted. Bytes decide: the reply keeps its in-context ids, diverging where its
    bytes do (position 7)."""
    from tokenizers import Tokenizer

    from strict_gate.engines.openai.text_only import in_context
    from strict_gate.judge.compare_runs import compare_runs
    from strict_gate.judge.resplit import resplit
    from strict_gate.judge.text_only import decoder, speller
    from strict_gate.runs.records import Record, ScoredStep, TextReply

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    enc = lambda s: list(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    half = tok.token_to_id("ð")  # the byte 0xF0 alone: a 4-byte character begun, never finished
    prompt, text = "Reply with an emoji:", " ok 👌\ufffd the end"
    placed = in_context(tok, prompt, text)
    ref = Record(id="e", prompt_token_ids=placed.prompt_ids, token_ids=(*enc(" ok 👌"), half, *enc(" a start")),
                 finish_reason="length")
    cand = Record(id="e", prompt_token_ids=placed.prompt_ids, token_ids=placed.continuation, finish_reason="length",
                  text_only=TextReply(text, len(placed.prompt_ids), 11))
    decode = decoder(MODEL / "tokenizer.json")
    assert decode(ref.prompt_token_ids, ref.token_ids[:8]) == decode(cand.prompt_token_ids, cand.token_ids[:8])
    comparison = compare_runs({"e": ref}, {"e": cand}, band=0.5, decode=decode)
    assert comparison.prompts[0].first_divergence.position == 7

    def score(prompt_ids, ids, k):  # the reference: 0xF0 first, then 0x9F (the emoji it meant)
        return [ScoredStep(t, None, ((half, -0.1), (tok.token_to_id("Ł"), -2.5))) for t in ids]

    again, records, n = resplit(comparison, {"e": ref}, {"e": cand}, score, 5, decode,
                                speller(MODEL / "tokenizer.json"), band=0.5, greedy_tolerance=1e-3)
    assert n == 0 and records["e"].token_ids == cand.token_ids  # before: re-split as ...0xF0 '¿' '½' ...
    assert again.prompts[0].first_divergence.position == 7


# ---- issue 50 item 10: check-engine holds a text-only server to what a gate asks of it


def test_check_engine_does_not_fail_a_text_only_server_on_streaming_a_gate_never_asks_for(user_dir, fake_openai):
    """A text-only server that answers a streamed request as a plain one: a gate's token runs
    never stream it, so check-engine says what it found without failing the server on it."""
    srv = _server(fake_openai, no_stream=True, tokenize=True)
    Path("engine.toml").write_text(f'kind = "openai"\nbase_url = "{srv.url}"\ntext_only = true\n'
                                   'tokenizer = "tokenizer"\nretries = 0\n')
    r = runner.invoke(app, ["check-engine", "engine.toml"], terminal_width=200)
    assert r.exit_code == 0, r.output  # before: exit 1, "FAIL stream"
    line = next(x for x in r.output.splitlines() if " stream " in x)
    assert line.split()[0] == "n/a" and "a gate's token runs never stream a text-only server" in line, line
    assert "only [speed] would" in line and "the stream ended without a finish_reason" in line, line


def test_tokens_a_server_counts_but_leaves_out_of_its_text_are_unverified_and_said_so(user_dir, fake_openai):
    """vllm.cpp leaves an incomplete UTF-8 character at the end out of its reply while its usage
    counts the token: the report said "the candidate stopped after 15 tokens ('length' vs 'length')",
    which the server's own count contradicts. Still never a pass; now the reason says what happened."""
    srv = _server(fake_openai, hide_last=1)
    r = runner.invoke(app, ["gate", str(_gate(Path("."), srv.url, policy="near-tie-reference-only"))])
    assert r.exit_code == 1, r.output
    cut = [p for p in _report(user_dir)["prompts"] if p["status"] == "length_mismatch"]
    assert cut and not any(p["passed"] for p in cut)
    for p in cut:
        assert "its server says it generated 16 (usage.completion_tokens): the last 1 cannot be seen" in p["reason"]
        assert "stopped after" not in p["reason"], p["reason"]
