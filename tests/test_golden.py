"""The [golden] arm on real engines (issue 52, item 3): the bundled tiny Llama in float32 as the
reference, in bfloat16 as the candidate, in float64 as the golden, all transformers on the CPU,
run as a user runs it (a gate TOML in a working directory, relative paths, the CLI).

Each vote is checked against an independent float64 forward pass made here with transformers
(its argmax at the divergence and both gaps, to 1e-9 nats: a golden whose logits were cast to
float32 would miss it), the section reloads and renders the same from report.json, and the exit
code rule is pinned: the golden restates a token failure (exit 6 only with blame), never a pass.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import section, write_gate
from test_feature_reload import assert_reloads, changed, console_text, refuses

from strict_gate.errors import ExitCode
from strict_gate.golden.load import load_golden
from strict_gate.golden.render import SECTION
from strict_gate.golden.result import GoldenResult, PromptVote
from strict_gate.golden.vote import Side, Vote
from strict_gate.judge.result import GateResult, overall_exit_code
from strict_gate.report.console import print_result

ROOT = Path(__file__).resolve().parent.parent
# two prompts the bf16 candidate flips on (near-ties) and two it matches
IDS = ("prose-001", "prose-006", "prose-014", "prose-002")


def _arm(dtype: str) -> dict:
    return {"kind": "hf", "model": "bundled:tiny-llama", "dtype": dtype}


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> tuple[GateResult, str, Path, dict]:
    """The gate, run from its working directory with relative paths: its result, console, report
    directory and report.json."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import run_gate

    tmp = tmp_path_factory.mktemp("golden")
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp)
    try:
        lines = [json.loads(line) for line in (ROOT / "prompts" / "battery-128.jsonl").read_text().splitlines()]
        Path("four.jsonl").write_text("".join(json.dumps(p) + "\n" for p in lines if p["id"] in IDS))
        write_gate(Path("."), name="tiny-golden", prompts="four.jsonl", max_tokens=16, policy="near-tie", band=0.5,
                   output_dir="reports", reference=_arm("float32"), candidate=_arm("bfloat16"),
                   golden={**_arm("float64"), "check_reference": True})
        outcome = run_gate(load_gate_config("gate.toml"))
        d = tmp / outcome.report_dir
        out = " ".join(console_text(lambda c: print_result(outcome.result, c)).split())
        return outcome.result, out, d, json.loads((d / "report.json").read_text())
    finally:
        mp.undo()


def _float64_view(prompt_ids: list[int], prefix: list[int]):
    """An independent float64 forward pass: the log-softmax after prompt + prefix."""
    import torch
    from transformers import AutoModelForCausalLM

    from strict_gate.core.model_files import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("bundled:tiny-llama", ROOT), dtype=torch.float64)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt_ids + prefix])).logits[0, -1]
    return torch.log_softmax(logits, dim=-1)


def test_the_float64_golden_votes_at_each_flip_as_an_independent_pass_says(gate):
    result, out, d, report = gate
    assert result.exit_code == 0 and report["exit_code"] == 0, out  # near-ties pass under near-tie; the votes annotate
    diverged = {p["id"]: p for p in report["prompts"] if p["first_divergence"] is not None}
    assert set(diverged) == {"prose-006", "prose-014"}  # the fixture's premise: two flips
    golden = section(report, "golden")
    assert golden["golden"]["options"]["dtype"] == "float64"
    assert report["features"]["golden"] == {**report["features"]["golden"], "verdict": "informational", "exit_code": 0}
    votes = {v["id"]: v for v in golden["votes"]}
    assert set(votes) == set(diverged)
    refs = {json.loads(line)["id"]: json.loads(line) for line in (d / "reference" / "records.jsonl").read_text().splitlines()}
    for pid, v in votes.items():
        div = diverged[pid]["first_divergence"]
        assert (v["position"], v["reference_token"], v["candidate_token"]) == (
            div["position"], div["reference_token"], div["candidate_token"])
        rec = refs[pid]
        lps = _float64_view(rec["prompt_token_ids"], rec["token_ids"][: v["position"]])
        argmax = int(lps.argmax())
        assert v["golden_argmax"] == argmax
        assert v["reference_gap"] == pytest.approx(float(lps[argmax] - lps[v["reference_token"]]), abs=1e-9)
        assert v["candidate_gap"] == pytest.approx(float(lps[argmax] - lps[v["candidate_token"]]), abs=1e-9)
        side = "reference" if argmax == v["reference_token"] else "candidate" if argmax == v["candidate_token"] else "neither"
        assert v["side"] == side
        assert f"golden: {pid}: position {v['position']}" in out
    health = golden["health"]
    assert sorted(p["id"] for p in health["prompts"]) == sorted(IDS) and all(p["error"] is None for p in health["prompts"])
    assert all(p["positions"] == 16 for p in health["prompts"])
    md = (d / "report.md").read_text()
    assert "## The golden's votes" in md and "The reference checked against the golden" in md
    assert "golden_verdict" in (d / "junit.xml").read_text() and "id='golden'" in (d / "report.html").read_text()


def test_the_golden_section_reloads_and_renders_the_same(gate):
    result, _, _, report = gate
    x = result.feature("golden")
    assert isinstance(x, GoldenResult) and x.to_json() == section(report, "golden")
    assert_reloads(x, load_golden, SECTION, "golden", result)
    blamed = GoldenResult(None, True, 0.5, ("a",), (_vote("a", Side.CANDIDATE), PromptVote("b", 2, None, "refused")), None,
                          ("a note",))
    assert_reloads(blamed, load_golden, SECTION, "golden", result)


def test_a_hostile_golden_body_is_an_input_error_naming_the_field(gate):
    body = section(gate[3], "golden")
    refuses(load_golden, changed(body, ("votes", 0, "side"), "sideways"), "golden", "votes[0].side")
    refuses(load_golden, changed(body, ("votes", 0, "reference_gap"), -1.0), "golden", "votes[0].reference_gap")
    refuses(load_golden, changed(body, ("blame",), drop=True), "golden", "blame")
    refuses(load_golden, {**body, "stray": 1}, "golden", "stray")


def _vote(pid: str, side: Side) -> PromptVote:
    ref, cand = 10, 20
    argmax = {Side.REFERENCE: ref, Side.CANDIDATE: cand, Side.NEITHER: 30}[side]
    return PromptVote(pid, 3, Vote(3, argmax, ref, cand, 0.0 if argmax == ref else 1.0, 0.0 if argmax == cand else 1.0))


def test_blame_exits_6_only_when_every_failing_prompt_has_the_reference_off():
    all_off = GoldenResult(None, True, 0.5, ("a", "b"), (_vote("a", Side.CANDIDATE), _vote("b", Side.CANDIDATE)))
    assert all_off.exit_code == ExitCode.REFERENCE_OFF_GOLDEN and all_off.section_verdict == "reference off the golden"
    mixed = replace(all_off, votes=(_vote("a", Side.CANDIDATE), _vote("b", Side.REFERENCE)))
    neither = replace(all_off, votes=(_vote("a", Side.CANDIDATE), _vote("b", Side.NEITHER)))
    unvoted = replace(all_off, votes=(_vote("a", Side.CANDIDATE),))  # a failing prompt the golden never voted on
    failed = replace(all_off, votes=(_vote("a", Side.CANDIDATE), PromptVote("b", 3, None, "scoring refused")))
    nothing_fails = replace(all_off, failing=())
    near_tie = replace(all_off, band=1.0)  # the reference's gap (1.0) within the band: too close to blame
    for r in (mixed, neither, unvoted, nothing_fails, near_tie):
        assert r.exit_code == ExitCode.PASS and not r.reference_off
    assert failed.exit_code == ExitCode.ENGINE_FAILURE and failed.section_verdict == "incomplete"
    assert replace(all_off, blame=False).exit_code == ExitCode.PASS


def test_the_golden_restates_a_token_failure_and_never_makes_a_pass():
    off = GoldenResult(None, True, 0.5, ("a",), (_vote("a", Side.CANDIDATE),))
    assert overall_exit_code(ExitCode.FAIL, [off]) == ExitCode.REFERENCE_OFF_GOLDEN
    assert overall_exit_code(ExitCode.ENGINE_FAILURE, [off]) == ExitCode.ENGINE_FAILURE  # incomplete stays 3
    assert overall_exit_code(ExitCode.PASS, [off]) == ExitCode.PASS  # nothing fails: no blame to state
    assert overall_exit_code(ExitCode.FAIL, [replace(off, blame=False)]) == ExitCode.FAIL


def test_vote_is_one_call_any_feature_can_make(gate):
    """`vote(golden, prompt_ids, prefix_ids, ref_token, cand_token)` on the real float64 golden:
    swapping the sides swaps the gaps and the side, and it agrees with the gate's own vote."""
    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.golden.vote import vote

    _, _, d, report = gate
    v = next(v for v in section(report, "golden")["votes"])
    rec = next(json.loads(line) for line in (d / "reference" / "records.jsonl").read_text().splitlines()
               if json.loads(line)["id"] == v["id"])
    with HFEngine(HFOptions(model="bundled:tiny-llama", dtype="float64")) as golden:
        prefix = rec["token_ids"][: v["position"]]
        one = vote(golden, rec["prompt_token_ids"], prefix, v["reference_token"], v["candidate_token"])
        other = vote(golden, rec["prompt_token_ids"], prefix, v["candidate_token"], v["reference_token"])
    assert (one.reference_gap, one.candidate_gap) == pytest.approx((v["reference_gap"], v["candidate_gap"]), abs=1e-12)
    assert (other.reference_gap, other.candidate_gap) == pytest.approx((one.candidate_gap, one.reference_gap), abs=1e-12)
    assert {one.side, other.side} <= {Side.REFERENCE, Side.CANDIDATE, Side.NEITHER}
    assert (one.side is Side.REFERENCE) == (other.side is Side.CANDIDATE)


class _Claims:
    """A golden that answers from fixed claims: its top-k, and a logprob per token scored."""

    def __init__(self, top: list[tuple[int, float]], lps: dict[int, float]):
        self.top, self.lps, self.calls = top, lps, 0

    def scoped_env(self):
        from contextlib import nullcontext

        return nullcontext()

    def score(self, prompt_ids, continuation_ids, k):
        from strict_gate.runs.records import ScoredStep

        self.calls += 1
        return [ScoredStep(t, self.lps.get(t), tuple(self.top)) for t in continuation_ids]


def test_vote_reads_each_token_where_it_was_scored_and_never_gives_a_negative_gap():
    from strict_gate.golden.vote import GoldenError, vote

    # the candidate's token outside the first pass's top-k: a second pass scores it
    g = _Claims([(10, -0.1), (11, -2.0)], {10: -0.1, 11: -2.0, 12: -7.0})
    v = vote(g, [1], [2], 11, 12)
    assert g.calls == 2 and (v.golden_argmax, v.side) == (10, Side.NEITHER)
    assert (v.reference_gap, v.candidate_gap) == pytest.approx((1.9, 6.9))
    # a side's token scored above the golden's own top-1 is its argmax: no negative gap
    v = vote(_Claims([(10, -0.5)], {10: -0.5, 11: -0.2, 12: -0.3}), [1], [], 11, 12)
    assert (v.golden_argmax, v.side, v.reference_gap) == (11, Side.REFERENCE, 0.0)
    assert v.candidate_gap == pytest.approx(0.1)
    with pytest.raises(GoldenError):  # no logprob for the candidate's token anywhere: no vote
        vote(_Claims([(10, -0.1)], {10: -0.1}), [1], [], 10, 12)
