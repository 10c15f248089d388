"""The [golden] arm against hostile engines (issue 52, item 3): a reference that emits a wrong
token is named by the golden, a candidate that does is named too, and a golden that cannot
score leaves the section incomplete, never a silent agreement.

The engines are real processes speaking the command protocol (tests/engines/golden_engine.py):
a toy model whose distribution is a pure function of the prefix; `--off J` makes an arm emit the
token the model ranks 2 nats below its argmax at position J. Each gate runs as a user runs it:
a gate TOML in a working directory, relative paths, the CLI. No mocks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import section, write_gate
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.errors import InputError

ENGINE = Path(__file__).parent / "engines" / "golden_engine.py"
PROMPTS = {"p0": [1, 2, 3], "p1": [4, 5, 6, 7]}
OFF = 3


def _arm(name: str, *args: str, script: str = "golden_engine.py") -> dict:
    return {"kind": "command", "command": ["python", script, name, *args]}


def _setup(tmp_path: Path, monkeypatch, *, ref=(), cand=(), golden=(), policy="near-tie", **golden_keys) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINE, "golden_engine.py")
    shutil.copy(ENGINE, "oracle.py")  # the golden's own copy: a test can take it away
    Path("prompts.jsonl").write_text("".join(json.dumps({"id": i, "token_ids": t}) + "\n" for i, t in PROMPTS.items()))
    write_gate(Path("."), name="golden", prompts="prompts.jsonl", max_tokens=6, top_logprobs=5, policy=policy,
               band=0.5, output_dir="reports", reference=_arm("reference", *ref), candidate=_arm("candidate", *cand),
               golden={**_arm("golden", *golden, script="oracle.py"), **golden_keys})


def _gate(tmp_path: Path, monkeypatch, **kw) -> tuple[int, str, Path, dict]:
    _setup(tmp_path, monkeypatch, **kw)
    result = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    (d,) = sorted(p for p in Path("reports").iterdir() if p.is_dir())
    return result.exit_code, " ".join(result.output.split()), d, json.loads((d / "report.json").read_text())


def _votes(report: dict) -> dict[str, dict]:
    return {v["id"]: v for v in section(report, "golden")["votes"]}


def test_a_reference_off_the_golden_is_named_and_with_blame_exits_6(tmp_path, monkeypatch):
    code, out, d, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)), blame=True)
    assert code == 6, out
    assert report["exit_code"] == 6 and report["verdict"] == "fail"  # the token verdict stays a failure
    golden = report["features"]["golden"]
    assert golden["verdict"] == "reference off the golden" and golden["exit_code"] == 6
    votes = _votes(report)
    assert set(votes) == set(PROMPTS)
    for v in votes.values():
        assert v["position"] == OFF and v["side"] == "candidate" and v["error"] is None
        assert v["golden_argmax"] == v["candidate_token"] != v["reference_token"]
        assert v["reference_gap"] == pytest.approx(2.0) and v["candidate_gap"] == pytest.approx(0.0)
    assert "golden: p0: position 3: the golden sides with the candidate: the REFERENCE is off the golden" in out
    md, html, junit = ((d / f).read_text() for f in ("report.md", "report.html", "junit.xml"))
    assert "FAIL (golden)" in md and "## The golden's votes" in md and "REFERENCE OFF THE GOLDEN" in md
    assert "id='golden'" in html and "the REFERENCE is off the golden" in html
    assert 'name="golden_verdict" value="reference off the golden"' in junit
    assert (d / "golden.log").exists()


def test_without_blame_the_vote_annotates_and_the_gate_exits_1(tmp_path, monkeypatch):
    code, out, _, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)))
    assert code == 1, out
    golden = report["features"]["golden"]
    assert golden["verdict"] == "reference off the golden" and golden["exit_code"] == 0
    assert "blame = false: informational" in golden["section"]["headline"]


def test_a_reference_off_the_golden_within_the_band_is_no_blame(tmp_path, monkeypatch):
    """A near-tie flip the strict policy fails, the golden on the candidate's side by 0.3 nats (band
    0.5): two precisions' rounding could land either way, so blame does not name the reference."""
    near = ("--gap", "0.3")
    code, out, _, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF), *near), cand=near, golden=near,
                                 policy="strict", blame=True)
    assert code == 1, out
    assert report["features"]["golden"]["verdict"] == "informational"
    for v in _votes(report).values():
        assert v["side"] == "candidate" and v["reference_gap"] == pytest.approx(0.3)


def test_a_candidate_off_the_golden_is_named_and_blame_leaves_exit_1(tmp_path, monkeypatch):
    code, out, _, report = _gate(tmp_path, monkeypatch, cand=("--off", str(OFF)), blame=True)
    assert code == 1, out
    assert report["features"]["golden"]["verdict"] == "informational"
    for v in _votes(report).values():
        assert v["side"] == "reference" and v["golden_argmax"] == v["reference_token"]
        assert v["candidate_gap"] == pytest.approx(2.0) and v["reference_gap"] == pytest.approx(0.0)
    assert "the golden sides with the reference" in out


@pytest.mark.parametrize("flag", ["--no-score", "--score-refuses", "--score-short"])
def test_a_golden_that_cannot_score_is_incomplete_never_blame(tmp_path, monkeypatch, flag):
    code, out, _, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)), golden=(flag,), blame=True)
    assert code == 1, out  # the token failure stands; no blame without the golden's word
    golden = report["features"]["golden"]
    assert golden["verdict"] == "incomplete" and golden["exit_code"] == 3
    assert all(v["side"] is None and v["error"] for v in _votes(report).values())
    assert "not voted 2 (incomplete)" in golden["section"]["headline"]


def test_a_passing_gate_whose_golden_cannot_check_the_reference_is_incomplete(tmp_path, monkeypatch):
    code, out, _, report = _gate(tmp_path, monkeypatch, golden=("--score-refuses",), check_reference=True)
    assert report["verdict"] == "pass"
    assert code == 3, out  # never a silent pass
    assert report["features"]["golden"]["verdict"] == "incomplete"


def test_the_reference_check_in_a_gate_counts_the_reference_off_the_golden(tmp_path, monkeypatch):
    code, out, d, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)), check_reference=True)
    assert code == 1, out
    health = section(report, "golden")["health"]
    assert [(p["id"], p["first"]) for p in health["prompts"]] == [("p0", OFF), ("p1", OFF)]
    assert all(p["gaps"][0] == pytest.approx(2.0) for p in health["prompts"])
    assert "off the golden's argmax on 2 of 2 prompt(s)" in (d / "report.md").read_text()


def test_a_golden_that_is_an_arm_itself_is_refused(tmp_path, monkeypatch):
    _setup(tmp_path, monkeypatch)
    text = Path("gate.toml").read_text().replace('"oracle.py", "golden"', '"golden_engine.py", "reference"')
    Path("gate.toml").write_text(text)
    result = CliRunner().invoke(app, ["gate", "gate.toml"])
    assert result.exit_code == 2 and "[golden] is the reference arm itself" in result.output
    assert not Path("reports").exists() or not any(Path("reports").iterdir())


def test_diagnose_keeps_the_votes_and_the_blame(tmp_path, monkeypatch):
    code, _, d, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)), blame=True)
    assert code == 6
    before = section(report, "golden")
    Path("oracle.py").unlink()  # diagnose must not start the golden again
    result = CliRunner().invoke(app, ["diagnose", str(d)])
    after = json.loads((d / "report.json").read_text())
    assert result.exit_code == 6, result.output
    assert section(after, "golden")["votes"] == before["votes"]


def test_strict_gate_golden_checks_the_reference_alone_and_seals_it(tmp_path, monkeypatch):
    from strict_gate.golden.command import read_check

    _setup(tmp_path, monkeypatch, ref=("--off", str(OFF)))
    result = CliRunner().invoke(app, ["golden", "gate.toml"], terminal_width=200)
    assert result.exit_code == 1, result.output  # off by 2 nats, beyond the band 0.5
    out = " ".join(result.output.split())
    assert "off the golden's argmax on 2 of 2 prompt(s), largest gap 2 (2 above band 0.5)" in out
    (d,) = sorted(Path("reports").iterdir())
    health = read_check(d)
    assert health.off == ("p0", "p1") and not health.failed
    assert "p0: off the golden's argmax from position 3" in (d / "golden.md").read_text()
    doc = json.loads((d / "golden.json").read_text())
    doc["health"]["prompts"][0]["gaps"] = [0.1]
    (d / "golden.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="does not match its digest"):
        read_check(d)


def test_strict_gate_golden_passes_a_reference_on_the_golden(tmp_path, monkeypatch):
    _setup(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["golden", "gate.toml"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "off the golden's argmax on 0 of 2 prompt(s)" in " ".join(result.output.split())


def test_a_gate_with_nothing_to_vote_on_never_starts_the_golden(tmp_path, monkeypatch):
    code, out, d, report = _gate(tmp_path, monkeypatch, golden=("--score-refuses",))
    assert code == 0, out
    golden = report["features"]["golden"]
    assert golden["verdict"] == "informational" and golden["section"]["headline"] == "no divergence to vote on"
    assert golden["section"]["golden"] is None and not (d / "golden.log").exists()


def test_resume_of_a_finished_gate_keeps_the_votes_and_exit_6(tmp_path, monkeypatch):
    code, _, d, report = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)), blame=True)
    assert code == 6
    Path("oracle.py").unlink()  # a finished gate's resume reads the section back, it does not vote again
    result = CliRunner().invoke(app, ["gate", "--resume", str(d)], terminal_width=200)
    assert result.exit_code == 6, result.output
    assert section(json.loads((d / "report.json").read_text()), "golden") == section(report, "golden")


def test_show_words_the_votes_from_report_json_without_torch(tmp_path, monkeypatch):
    import subprocess
    import sys

    _, _, d, _ = _gate(tmp_path, monkeypatch, ref=("--off", str(OFF)), blame=True)
    code = ("import sys; from typer.testing import CliRunner; from strict_gate.cli import app; "
            f"r = CliRunner().invoke(app, ['show', {str(d)!r}], terminal_width=200); print(r.exit_code); "
            "print(' '.join(r.output.split())); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "golden: p1: position 3: the golden sides with the candidate: the REFERENCE is off the golden" in out
    assert out.strip().endswith("[]"), out


def test_a_bisect_step_runs_the_tokens_without_the_golden(tmp_path, monkeypatch):
    """A bisect step loads no second engine: a golden (and its exit 6) would skip every commit."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.nightly.bisect import step_config

    _setup(tmp_path, monkeypatch, blame=True)
    cfg = load_gate_config("gate.toml")
    assert "golden" in cfg.features
    step = step_config(cfg, Path("prompts.jsonl"), tmp_path, tmp_path / "bisect")
    assert "golden" not in step.features


VARIANT_ENGINE = Path(__file__).parent / "engines" / "variant_engine.py"


def _variant_gate(tmp_path: Path, monkeypatch, *golden_args: str, policy: str = "informational") -> tuple[int, str, dict]:
    """Both arms the same engine, whose token 2 moves under a cut prefill (every prompt, both arms);
    the golden the same model scoring (tests/engines/variant_engine.py)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(VARIANT_ENGINE, "variant_engine.py")
    Path("prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1 + i, 2, 3, 4]}) + "\n"
                                             for i in range(3)))
    arm = {"kind": "command", "command": ["python", "variant_engine.py", "--mode", "chunk"]}
    write_gate(Path("."), name="golden-variants", prompts="prompts.jsonl", max_tokens=4, top_logprobs=2,
               policy="strict", band=0.5, output_dir="reports", reference=arm, candidate=arm,
               invariance={"arms": ["candidate", "reference"], "chunked_prefill": [2], "policy": policy},
               golden={"kind": "command", "command": ["python", "variant_engine.py", "--score", "--tag", "golden",
                                                      *golden_args]})
    result = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    (d,) = sorted(p for p in Path("reports").iterdir() if p.is_dir())
    return result.exit_code, " ".join(result.output.split()), json.loads((d / "report.json").read_text())


@pytest.mark.parametrize("how", ["error", "garbage"])
def test_a_golden_that_breaks_mid_variant_voting_leaves_them_unjudged_and_the_exit_code_alone(tmp_path, monkeypatch,
                                                                                              how):
    """The golden answers its first score request (p0, one vote for both arms' same move) and then
    breaks: the moves after it are unjudged, never an agreement, and the exit code is the tokens'
    and the variants' (the candidate moves with the reference under strict: 0). A reply the
    protocol refuses (garbage) restarts the command engine, whose count starts again: p2 is voted."""
    code, out, report = _variant_gate(tmp_path, monkeypatch, "--score-breaks-after", "1", "--score-break", how,
                                      policy="strict")
    assert code == 0, out
    assert report["verdict"] == "pass"
    golden = report["features"]["golden"]
    assert golden["exit_code"] == 0 and golden["verdict"] == "informational"  # the token votes: none to give
    vv = section(report, "golden")["variant_votes"]
    assert vv["verdict"] == "unjudged" and vv["moves"] == 6
    by = {(v["arm"], v["id"]): v for v in vv["votes"]}
    assert by["candidate", "p0"]["side"] == by["reference", "p0"]["side"] == "batch-1"
    broken = [v for v in by.values() if v["side"] is None]
    assert {("candidate", "p1"), ("reference", "p1")} <= {(v["arm"], v["id"]) for v in broken}
    assert len(broken) == (4 if how == "error" else 2)
    assert all(v["error"] and v["golden_argmax"] is None and v["batch1_gap"] is None for v in broken)
    assert f"not voted {len(broken)} (unjudged)" in vv["headline"] and f"not voted {len(broken)} (unjudged)" in out


def test_the_variant_votes_with_a_cap_of_0_start_no_golden_and_say_unjudged(tmp_path, monkeypatch):
    code, out, report = _variant_gate(tmp_path, monkeypatch)
    assert code == 0, out
    assert section(report, "golden")["variant_votes"]["verdict"] == "informational"
    (tmp_path / "gate.toml").write_text((tmp_path / "gate.toml").read_text().replace(
        "[golden]\n", "[golden]\nvariant_votes = 0\n"))
    assert CliRunner().invoke(app, ["gate", "gate.toml"]).exit_code == 0
    latest = sorted(p for p in Path("reports").iterdir() if p.is_dir())[-1]
    doc = json.loads((latest / "report.json").read_text())
    vv = section(doc, "golden")["variant_votes"]
    assert vv["votes"] == [] and vv["verdict"] == "unjudged" and "6 beyond the cap of 0" in vv["headline"]
    assert section(doc, "golden")["golden"] is None  # never started
