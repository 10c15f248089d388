"""Every token after a flip is judged (issue 24): a near-tie at the first divergence no longer
passes whatever the candidate emits after it.

The engines are real processes speaking the command protocol (tests/engines/cascade_engine.py):
a toy model whose distribution is a pure function of the token prefix, decoded by the reference
and, with scripted departures, by a hostile candidate that claims each of its tokens as its own
top-1 (so the run audit accepts them). Each gate runs as a user runs it: a gate TOML in a working
directory, relative paths, `strict-gate gate gate.toml`. No mocks. The hypothesis property runs
the library path the gate takes (diagnose, cross_check, apply_policy) with the same toy model
scoring in-process, since hundreds of gates with engine processes would not fit a test run.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest
from engines import cascade_engine  # the toy model, for the in-process property
from helpers import write_gate
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.diagnose import cross_check, diagnose
from strict_gate.judge.policy import apply_policy
from strict_gate.report.show import show
from strict_gate.runs.records import Record, ScoredStep

ENGINE = Path(__file__).parent / "engines" / "cascade_engine.py"
BUNDLED = Path(__file__).parent.parent / "strict_gate" / "models" / "tiny-llama"

MAX_TOKENS = 8
PROMPTS = {"p0": [1, 2, 3], "p1": [4, 5, 6, 7]}


def _setup(tmp_path: Path, monkeypatch, *cand_args: str, policy: str = "near-tie", cand_opts=None, **top) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINE, "cascade_engine.py")
    Path("prompts.jsonl").write_text("".join(json.dumps({"id": i, "token_ids": t}) + "\n" for i, t in PROMPTS.items()))
    reference = top.pop("reference", {"kind": "command", "command": ["python", "cascade_engine.py", "reference"]})
    candidate = top.pop("candidate", {"kind": "command", "command": ["python", "cascade_engine.py", "candidate",
                                                                     *cand_args], **(cand_opts or {})})
    write_gate(Path("."), name="cascade", prompts="prompts.jsonl", max_tokens=MAX_TOKENS, top_logprobs=5,
               policy=policy, band=0.5, output_dir="reports", reference=reference,
               candidate=candidate, **top)


def _gate(tmp_path: Path, monkeypatch, *cand_args: str, **kw) -> tuple[int, str, Path, dict]:
    _setup(tmp_path, monkeypatch, *cand_args, **kw)
    result = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    (d,) = sorted(p for p in Path("reports").iterdir() if p.is_dir())
    return result.exit_code, result.output, d, json.loads((d / "report.json").read_text())


def _prompt(report: dict, pid: str = "p0") -> dict:
    return next(p for p in report["prompts"] if p["id"] == pid)


def _formats(d: Path, pid: str = "p0") -> dict[str, str]:
    buf = io.StringIO()
    show(d, pid, Console(file=buf, width=240))
    return {"md": (d / "report.md").read_text(), "html": (d / "report.html").read_text(),
            "junit": (d / "junit.xml").read_text(), "show": buf.getvalue()}


def test_a_flip_then_garbage_fails_naming_the_first_later_divergence(tmp_path, monkeypatch):
    """(a) A near-tie at position 2, then tokens the reference ranks 4.9 nats below its argmax."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--garbage")
    assert code == 1, out  # today's main passed it (exit 0)
    p = _prompt(report)
    assert p["status"] == "near_tie" and not p["passed"] and p["outcome"] == "fail"
    assert p["reason"].startswith("divergent after a near-tie: later position 3")
    later = p["diagnosis"]["later"]
    assert later["outcome"] == "divergent" and later["judged"] == MAX_TOKENS - 3
    assert later["divergent"] == MAX_TOKENS - 3 and later["divergent_positions"][0]["position"] == 3
    assert later["divergent_positions"][0]["reference_gap"] == pytest.approx(4.9)
    assert report["later"]["later_divergent"] == 2 * (MAX_TOKENS - 3)
    text = _formats(d)
    assert "| p0 | 2 | 5/5 | 0 | 4.9000 | 3: " in text["md"]
    assert "first later divergence at 3" in text["show"]
    assert "first later divergence at 3" in text["html"]
    failure = ElementTree.fromstring(text["junit"]).find("testcase[@name='p0']/failure")
    assert failure is not None and "later position 3" in (failure.text or "")
    flat = " ".join(out.split())  # the console wraps at its width
    assert "later div at 3" in flat  # the table's why column
    assert "10/10 later position(s) judged, 0 later flip(s), 10 later divergent position(s) in 2 prompt(s)" in flat


def test_b_a_flip_then_the_reference_argmax_passes(tmp_path, monkeypatch):
    """(b) Flip at a near-tie, then every token the reference's argmax on the candidate's prefix."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2")
    assert code == 0, out
    later = _prompt(report)["diagnosis"]["later"]
    assert (later["outcome"], later["judged"], later["flips"], later["divergent"]) == ("follows", 5, 0, 0)
    assert report["later"] == {"prompts_flipped": 2, "later_positions": 10, "judged": 10, "later_flips": 0,
                               "later_divergent": 0, "prompts_divergent_later": 0, "unverified": 0,
                               "prompts_unverified": 0}
    assert "5/5 later position(s) judged, 0 later flip(s)" in _prompt(report)["reason"]
    for name, body in _formats(d).items():
        assert "5/5 later position(s) judged" in body, name


@pytest.mark.parametrize("policy", ["strict", "auto"])
def test_b_under_strict_and_auto_still_fails(tmp_path, monkeypatch, policy):
    """Strict is unchanged; auto without reference samples is strict: neither accepts a near-tie."""
    code, out, _, report = _gate(tmp_path, monkeypatch, "--flip", "2", policy=policy)
    assert code == 1, out
    assert "near-tie fails under strict" in _prompt(report)["reason"]


def test_c_a_second_near_tie_flip_passes_and_is_counted(tmp_path, monkeypatch):
    """(c) Flip at 2, follow, flip again at 5 where the reference's top-2 are 0.05 apart: two flips."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--flip", "5")
    assert code == 0, out
    later = _prompt(report)["diagnosis"]["later"]
    assert (later["outcome"], later["flips"], later["divergent"]) == ("near_tie", 1, 0)
    assert later["worst_gap"] == pytest.approx(0.05)
    assert report["later"]["later_flips"] == 2  # one later flip in each prompt, plus each first flip
    assert "1 later flip(s)" in (d / "report.md").read_text()


def test_d_one_token_two_nats_off_at_the_last_position_fails(tmp_path, monkeypatch):
    """(d) Flip, follow, then a token 2 nats below the reference's argmax at the last position."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--off", str(MAX_TOKENS - 1))
    assert code == 1, out
    p = _prompt(report)
    assert p["reason"].startswith(f"divergent after a near-tie: later position {MAX_TOKENS - 1}")
    (lp,) = p["diagnosis"]["later"]["divergent_positions"]
    assert lp["position"] == MAX_TOKENS - 1 and lp["reference_gap"] == pytest.approx(2.0)
    assert "reference re-scored |gap| 2.0000 > band 0.5" in lp["reason"]


def test_e_no_rescoring_leaves_the_prompt_unverified(tmp_path, monkeypatch):
    """(e) The same gate with diagnose = false: nothing judged after the flip, exit 3, never 0."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--off", str(MAX_TOKENS - 1), diagnose=False)
    assert code == 3, out  # today's main passed it (exit 0)
    p = _prompt(report)
    assert p["outcome"] == "unverified" and not p["passed"]
    assert "positions 3-7 after the flip not judged" in p["reason"]
    assert report["verdict"] == "incomplete" and "unverified" in report["reasons"][0]
    assert report["later"]["unverified"] == 10 and report["later"]["judged"] == 0
    junit = ElementTree.fromstring((d / "junit.xml").read_text())
    assert junit.find("testcase[@name='p0']/error") is not None


def test_e_a_recorded_reference_without_a_rescorer_is_unverified(tmp_path, monkeypatch):
    """(e) A stored reference run and no [rescorer]: the continuation cannot be judged."""
    code, out, d, _ = _gate(tmp_path, monkeypatch, "--flip", "2")  # a live gate first: its reference run
    assert code == 0, out
    shutil.copytree(d / "reference", "ref-run")
    shutil.rmtree("reports")
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--off", str(MAX_TOKENS - 1),
                                 reference={"kind": "recorded", "path": "ref-run"})
    assert code == 3, out
    assert _prompt(report)["outcome"] == "unverified"
    assert "not judged" in _prompt(report)["reason"]


def test_f_a_candidate_whose_score_refuses_is_judged_from_its_decode_top_k(tmp_path, monkeypatch):
    """(f) The candidate's score op errors: later positions are judged with the reference's
    re-scoring and the candidate's decode top-k, and the report says what is unknown and why."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--flip", "5", "--score-refuses")
    assert code == 0, out
    later = _prompt(report)["diagnosis"]["later"]
    assert later["flips"] == 1 and later["outcome"] == "near_tie"
    assert "candidate side from its decode top-k only" in later["candidate_note"]
    assert "scoring refused" in later["candidate_note"]


def test_f_without_the_candidates_gap_a_later_flip_is_divergent(tmp_path, monkeypatch):
    """(f) ... and where its decode top-k omits the reference's argmax too, the later flip's
    candidate gap is unknown, which never makes a near-tie (the rule at the first divergence)."""
    code, out, _, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--flip", "5", "--score-refuses",
                                 "--hide-argmax", "5")
    assert code == 1, out
    (lp,) = _prompt(report)["diagnosis"]["later"]["divergent_positions"]
    assert lp["position"] == 5 and "candidate gap unknown" in lp["reason"]


def test_a_negative_rescored_gap_is_named_and_never_called_within_zero_band(tmp_path, monkeypatch):
    """The candidate's prefill ranks the reference's token above its own where its decode chose its
    own: a near-tie by size, said as a prefill/decode disagreement, never "within [0, band]"."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--flip", "5", "--prefill-disagrees")
    assert code == 0, out
    p = _prompt(report)
    reason = p["first_divergence"]["reason"]
    assert p["first_divergence"]["candidate_rescored"]["gap"] == pytest.approx(-0.03)
    assert "[0, band" not in reason and "prefill/decode disagreement" in reason
    assert p["diagnosis"]["later"]["prefill_decode"] == [5]
    assert "[0, band" not in (d / "report.md").read_text().split("## Teacher-forced diagnosis")[1]


@pytest.mark.parametrize("policy", ["near-tie", "near-tie-reference-only"])
def test_a_candidate_that_stops_early_after_a_flip_is_never_a_pass(tmp_path, monkeypatch, policy):
    """A flip at 2, the reference's argmax at 3 and 4, then "stop" after 4 on an ordinary token:
    5 of 8 tokens, every one judged, but the stop itself is not (the gate knows no end-of-sequence
    id), so positions 5-7, where the reference would have gone on, are unjudged: never a pass."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--stop", "4", policy=policy)
    assert code == 3, out  # before: exit 0, "5/5 later position(s) judged" of a 5-token reply
    p = _prompt(report)
    assert p["outcome"] == "unverified" and not p["passed"]
    assert "stopped after 5 of 8 tokens" in p["reason"] and "positions 5-7" in p["reason"]
    assert report["verdict"] == "incomplete"
    for name, body in _formats(d).items():
        assert "stopped after 5 of 8 tokens" in " ".join(body.split()), name


def test_a_stop_on_an_id_that_is_not_an_eos_is_never_a_pass(tmp_path, monkeypatch):
    """The same early stop where the gate knows the end-of-sequence ids (eos_token_ids = [2]) from
    a stored candidate run (the engine's reply check no longer sees it): never a pass."""
    code, out, d, _ = _gate(tmp_path, monkeypatch, "--flip", "2", "--stop", "4")
    shutil.copytree(d / "candidate", "cand-run")
    manifest = json.loads(Path("cand-run/manifest.json").read_text())
    manifest["engine"]["options"]["eos_token_ids"] = [2]
    Path("cand-run/manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree("reports")
    code, out, d, report = _gate(tmp_path, monkeypatch, candidate={"kind": "recorded", "path": "cand-run"})
    assert code == 3, out
    assert "on token" in _prompt(report)["reason"] and "not an end-of-sequence id [2]" in _prompt(report)["reason"]


@pytest.mark.parametrize("eos, code", [([2], 0), (None, 3)])
def test_a_flip_then_a_real_eos_passes_only_where_the_eos_is_known(tmp_path, monkeypatch, eos, code):
    """Both arms' model ends at position 5 (its argmax the EOS, 2): a flip at 2, then the
    reference's argmax to the EOS, is a whole judgement with eos_token_ids = [2] (exit 0), and
    without any known end-of-sequence id the stop is unjudged (exit 3)."""
    opts = {"eos_token_ids": eos} if eos else {}
    got, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--eos-at", "5", cand_opts=opts,
                                reference={"kind": "command", "command": ["python", "cascade_engine.py",
                                                                          "reference", "--eos-at", "5"]})
    assert got == code, out
    p = _prompt(report)
    assert p["status"] == "near_tie" and p["diagnosis"]["later"]["judged"] == 3
    assert ("no end-of-sequence id" in p["reason"]) == (eos is None)


@pytest.mark.parametrize("spelled", ["cascade_engine.py", "./cascade_engine.py"])
def test_a_rescorer_that_is_the_candidate_itself_is_refused(tmp_path, monkeypatch, spelled):
    """A stored reference and a [rescorer] that is the candidate's own command (however its path
    is spelled): re-scored by itself, the candidate's garbage after a flip is each time its own
    argmax, so it would vouch for itself. Refused before any engine starts: exit 2, naming it."""
    code, out, d, _ = _gate(tmp_path, monkeypatch, "--flip", "2")  # a live gate first: its reference run
    shutil.copytree(d / "reference", "ref-run")
    shutil.rmtree("reports")
    hostile = ["--flip", "2", "--garbage"]
    _setup(tmp_path, monkeypatch, *hostile, reference={"kind": "recorded", "path": "ref-run"},
           rescorer={"kind": "command", "command": ["python", spelled, "candidate", *hostile]})
    r = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    assert r.exit_code == 2, r.output  # before: exit 0, "5/5 later position(s) judged, 0 later flip(s)"
    flat = " ".join(r.output.split())
    assert "gate.toml" in flat and "[rescorer] is the candidate itself: the same command line" in flat
    assert not Path("reports").exists() or not any(Path("reports").iterdir())


def test_a_rescorer_on_the_candidates_model_files_is_refused(tmp_path, monkeypatch):
    """The same engine kind on a copy of the candidate's model files (one digest) in its dtype is
    the candidate too, under another path; refused before any model loads (exit 2)."""
    code, out, d, _ = _gate(tmp_path, monkeypatch, "--flip", "2")
    shutil.copytree(d / "reference", "ref-run")
    shutil.copytree(BUNDLED, "copy-of-the-model")
    hf = {"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"}
    _setup(tmp_path, monkeypatch, reference={"kind": "recorded", "path": "ref-run"}, candidate=hf,
           rescorer=hf | {"model": "copy-of-the-model"})
    r = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    assert r.exit_code == 2, r.output
    assert "the same model files (sha256-files:" in r.output and "engine kind (hf) and dtype (float32)" in r.output


def test_diagnose_refuses_a_rescorer_that_is_the_candidate(tmp_path, monkeypatch):
    """`strict-gate diagnose REPORT_DIR` of a gate whose gate.toml now names the candidate as its
    [rescorer] is refused the same way (exit 2), its report left as it was."""
    code, out, d, _ = _gate(tmp_path, monkeypatch, "--flip", "2")
    shutil.copytree(d / "reference", "ref-run")
    shutil.rmtree("reports")
    hostile = ["--flip", "2", "--garbage"]
    code, out, d, before = _gate(tmp_path, monkeypatch, *hostile, reference={"kind": "recorded", "path": "ref-run"})
    assert code == 3, out  # no re-scoring: unverified
    table = '\n[rescorer]\nkind = "command"\ncommand = ["python", "cascade_engine.py", "candidate", "--flip", "2", "--garbage"]\n'
    (d / "gate.toml").write_text((d / "gate.toml").read_text() + table)
    r = CliRunner().invoke(app, ["diagnose", str(d)], terminal_width=200)
    assert r.exit_code == 2, r.output
    assert "is the candidate itself" in " ".join(r.output.split())
    assert json.loads((d / "report.json").read_text())["verdict"] == before["verdict"] == "incomplete"


def test_a_negative_decode_gap_within_the_greedy_tolerance_is_said_as_one(tmp_path, monkeypatch):
    """At its flip the candidate's decode ranks the reference's token 0.0005 nats above its own
    choice, within the greedy tolerance (1e-3) the gate accepted it as greedy by; its prefill
    says the same. Its own logits did not flip, so it is no near-tie (divergent, as before); but
    the words must not say its choice was "not its own argmax" (the greedy check passed it), nor
    call it a prefill/decode disagreement (both paths agree): they name the tolerance."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--lean", "2")
    assert code == 1, out
    p = _prompt(report)
    fd = p["first_divergence"]
    assert p["status"] == "divergent" and fd["candidate_gap"] == pytest.approx(-0.0005)
    for words in ("not its own argmax", "prefill/decode disagreement", "[0, band"):
        assert words not in fd["reason"], fd["reason"]  # before: "... so its choice was not its own argmax"
    assert "within the greedy tolerance 0.001 (its choice passes as greedy), so its logits did not flip" in fd["reason"]
    assert "not its own argmax" not in (d / "report.md").read_text()


def test_a_negative_decode_gap_beyond_the_greedy_tolerance_is_not_greedy(tmp_path, monkeypatch):
    """The same lean with a greedy tolerance of 1e-4: the greedy check fails it, and says so."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2", "--lean", "2", greedy_tolerance=1e-4)
    assert code == 1, out
    assert _prompt(report)["status"] == "not_greedy"


# ------------------------------------------------------------- property (library path)


class _ToyScorer:
    """The toy model scoring in-process: the reference side of diagnose()."""

    def start(self) -> None: ...

    def scoped_env(self):
        import contextlib

        return contextlib.nullcontext()

    def score(self, prompt_ids, continuation_ids, k):
        out = []
        for j, t in enumerate(continuation_ids):
            top = cascade_engine.model(list(prompt_ids) + list(continuation_ids[:j]), j)[:k]
            out.append(ScoredStep(token_id=t, logprob=cascade_engine.lp(top, t), top=tuple(top)))
        return out


def _record(pid: str, prompt: list[int], tokens: list[int], tops) -> Record:
    return Record(id=pid, prompt_token_ids=tuple(prompt), token_ids=tuple(tokens), finish_reason="length",
                  top_logprobs=tuple(tuple(t) for t in tops))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 2, 3, 4]), min_size=1, max_size=5).filter(lambda c: any(c)), st.randoms())
def test_tokens_the_reference_ranks_beyond_the_band_never_pass(choices, rnd):
    """After a near-tie flip, any continuation holding a token the reference ranks beyond the
    band on the candidate's own prefix (rank 2, 3 or 4 of the toy model: 2, 4.9, 6.9 nats off;
    rank 0 is its argmax) fails, whatever the candidate claims about its own top-k."""
    prompt, n = [1, 2, 3], 3 + len(choices)
    ref_tokens, ref_tops, tokens, tops = [], [], [], []
    for j in range(n):  # the reference's own greedy path
        top = cascade_engine.model(prompt + ref_tokens, j)
        ref_tokens.append(top[0][0])
        ref_tops.append(top)
    for j in range(n):  # the candidate: argmax, a flip at the 0.05 tie at 2, then the drawn ranks
        top = cascade_engine.model(prompt + tokens, j)
        pick = top[0][0] if j < 2 else top[1][0] if j == 2 else top[choices[j - 3]][0]
        claimed = [(pick, -0.1), *((t, -0.15 - i) for i, (t, _) in enumerate(top) if t != pick)]
        tokens.append(pick)
        tops.append(claimed[:5] if j <= 2 or rnd.random() < 0.5 else claimed[:1])  # its top-k: any claim
    ref = {"p": _record("p", prompt, ref_tokens, ref_tops)}
    cand = {"p": _record("p", prompt, tokens, tops)}
    comparison = compare_runs(ref, cand, band=0.5)
    assert comparison.prompts[0].status == "near_tie"
    diagnoses = diagnose(comparison, ref, cand, _ToyScorer(), 5)
    comparison, diagnoses = cross_check(comparison, diagnoses, {}, cand, not_scored="not scored")
    later = {pid: dg.later for pid, dg in diagnoses.items() if dg.later is not None}
    verdict = apply_policy(comparison, "near-tie", ref, cand, later=later)
    assert verdict.verdict == "fail" and not verdict.prompts[0].passed
    first_off = 3 + next(i for i, c in enumerate(choices) if c)
    assert later["p"].divergent[0].position == first_off


def test_one_sided_judgement_reads_the_reference_gaps_alone():
    """The reuse a text-only arm needs: judge_later with the reference's re-scored gaps only."""
    from strict_gate.judge.cascade import Later, ScoredPosition, judge_later

    steps = [ScoredPosition(3, 7, 0.0, 7), ScoredPosition(4, 8, 0.3, 9), ScoredPosition(5, 6, 0.9, 1)]
    c = judge_later(2, 7, steps, 0.5, candidate=None, one_sided=True, why_short="scored 6 of 7")
    assert (c.judged, c.flip_count, c.divergent_count, c.unverified_from) == (3, 1, 1, 6)
    assert c.outcome == Later.DIVERGENT and c.divergent[0].position == 5
    assert "0.9000 > band 0.5" in c.divergent[0].reason and c.unverified == "position 6 after the flip not judged: scored 6 of 7"
    tie = judge_later(2, 5, steps[:2], 0.5, candidate=None, one_sided=True)
    assert tie.outcome == Later.NEAR_TIE and tie.flips[0].reason == "reference gap 0.3 within the band 0.5"


def test_a_report_whose_later_judgement_is_malformed_is_refused(tmp_path, monkeypatch):
    """report.json's new fields are typed: a hand-edited `later` is bad input (exit 2), and a
    report written before them (no `later`, no `outcome`) still reads."""
    code, out, d, report = _gate(tmp_path, monkeypatch, "--flip", "2")
    assert code == 0, out
    p = _prompt(report)
    p["diagnosis"]["later"]["judged"] = -1
    (d / "report.json").write_text(json.dumps(report))
    r = CliRunner().invoke(app, ["show", str(d)])
    assert r.exit_code == 2 and "judged" in r.output, r.output
    for q in report["prompts"]:
        q.pop("outcome", None)
        if q.get("diagnosis"):
            q["diagnosis"].pop("later", None)
    report.pop("later")
    (d / "report.json").write_text(json.dumps(report))
    r = CliRunner().invoke(app, ["show", str(d)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, code", [(("--flip", "2"), 0), (("--flip", "2", "--garbage"), 1)])
def test_resuming_a_finished_near_tie_gate_reads_its_own_verdict(tmp_path, monkeypatch, args, code):
    """`gate --resume` of a finished gate loads no engine: it judges again from the diagnoses
    report.json stored (both sides' gaps, every later position), so a near-tie gate that passed
    still passes (it read 'unverified' and was refused before) and one that failed still fails."""
    got, out, d, _ = _gate(tmp_path, monkeypatch, *args)
    assert got == code, out
    r = CliRunner().invoke(app, ["gate", "--resume", str(d)], terminal_width=200)
    assert r.exit_code == code, r.output
    assert "start a new gate" not in r.output
