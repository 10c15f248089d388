"""One result ("One result", report@3): every command that rewrites a finished gate's reports keeps
the sections it did not redo, so its exit code and every format still say what the gate said.

Each test runs the real CLI as a subprocess, as a user does: from a working directory, the gate
config's `prompts` and `output_dir` relative, against real command engines (tests/engines/):
variant_engine.py (tokens that move with requests in flight), speed_engine.py (a known speed) and
toy_dump_engine.py (a toy model that dumps activations, with a planted bug). Then `strict-gate
diagnose`, `strict-gate localize` and `gate --resume` of the finished gate must keep each
section (report.json's features.<name> byte-for-byte), the exit code, report.md's heading,
junit.xml's failures and the console's section verdict; a report.json edited so a section
could be lost or read as passing is refused (exit 2) naming report.json, never rewritten as a pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from helpers import write_gate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANT = str(HERE / "engines" / "variant_engine.py")
SPEED = str(HERE / "engines" / "speed_engine.py")
TOY = str(HERE / "engines" / "toy_dump_engine.py")


def cli(*args: str) -> subprocess.CompletedProcess:
    """`strict-gate ARGS` as a subprocess, from the current working directory; a traceback (exit 1,
    like a token failure) is a failure of the test, never an exit code to compare."""
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                       timeout=600, env=os.environ | {"COLUMNS": "200"})
    assert "Traceback" not in p.stderr + p.stdout, said(p)
    return p


def said(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"


def report_dir() -> Path:
    """The one gate report directory under ./out (relative, as the user sees it)."""
    (d,) = [x for x in Path("out").iterdir() if x.is_dir()]
    assert not d.is_absolute()
    return d


def doc(d: Path) -> dict:
    return json.loads((d / "report.json").read_text(encoding="utf-8"))


def feature_json(d: Path, name: str) -> str:
    """report.json's features.<name> (verdict, exit code, section) as canonical text."""
    return json.dumps(doc(d)["features"][name], sort_keys=True)


def heading(d: Path) -> str:
    return (d / "report.md").read_text(encoding="utf-8").splitlines()[0]


def junit_failures(d: Path) -> int:
    return int(ET.parse(d / "junit.xml").getroot().get("failures"))


def invariance_gate(where: Path, *, candidate_mode: str = "in_flight") -> str:
    """gate.toml with relative paths: six prompts, both arms variant_engine.py (the reference scores,
    so `diagnose` can run), [invariance] batch 4. The candidate's tokens move when requests share a
    batch: the token verdict passes (both arms at batch 1), invariance exits 5."""
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]})
                                           + "\n" for i in range(6)), encoding="utf-8")
    write_gate(where, prompts="p.jsonl", max_tokens=4, top_logprobs=2, output_dir="out", policy="strict",
               reference={"kind": "command", "command": ["python", VARIANT, "--score"]},
               candidate={"kind": "command", "command": ["python", VARIANT, "--mode", candidate_mode],
                          "timeout_s": 5.0},
               invariance={"policy": "strict", "batch": [4]})
    return "gate.toml"


@pytest.fixture
def moved(tmp_path, monkeypatch) -> Path:
    """A finished gate whose tokens pass and whose invariance fails (exit 5): its report directory."""
    monkeypatch.chdir(tmp_path)
    p = cli("gate", invariance_gate(Path(".")))
    assert p.returncode == 5, said(p)
    assert "NOT INVARIANT (batch-4)" in p.stdout, said(p)
    d = report_dir()
    assert doc(d)["verdict"] == "pass" and doc(d)["exit_code"] == 5
    return d


# ---------------------------------------------------------------------------- (a) diagnose keeps invariance


def test_diagnose_of_a_gate_that_moved_under_invariance_still_exits_5(moved):
    """Was: exit 0 and "# PASS" (the rewrite dropped the invariance section)."""
    before = feature_json(moved, "invariance")
    assert heading(moved).startswith("# FAIL (invariance)") and junit_failures(moved) >= 1
    p = cli("diagnose", str(moved))
    assert p.returncode == 5, said(p)
    assert heading(moved).startswith("# FAIL (invariance)"), heading(moved)
    assert junit_failures(moved) >= 1
    after = doc(moved)
    assert after["exit_code"] == 5 and after["overall"] == "fail (invariance)" and after["verdict"] == "pass"
    assert feature_json(moved, "invariance") == before  # kept byte for byte
    assert "NOT INVARIANT (batch-4)" in p.stdout, said(p)
    html = (moved / "report.html").read_text(encoding="utf-8")
    assert "FAIL (invariance): " in html.split("class=\"banner\"", 1)[1].split("</div>", 1)[0]


# ---------------------------------------------------------------------------- (b) diagnose keeps speed


def test_diagnose_of_a_gate_slower_than_its_bar_keeps_exit_4_and_the_speed_section(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.jsonl").write_text("\n".join((ROOT / "prompts" / "smoke.jsonl").read_text().splitlines()[:2])
                                        + "\n", encoding="utf-8")
    arm = {"kind": "command", "command": ["python", SPEED, "--ttft", "0.01", "--per-token", "0.01"],
           "tokenizer": "bundled:tiny-llama"}
    write_gate(tmp_path, name="speedy", prompts="two.jsonl", max_tokens=4, output_dir="out", policy="strict",
               reference=arm, candidate=arm,
               speed={"warmup": 0, "runs": 4, "rungs": ["8/4"], "min_speed_ratio": {"decode": 10.0}})
    p = cli("gate", "gate.toml")
    assert p.returncode == 4, said(p)
    d = report_dir()
    before = feature_json(d, "speed")
    assert doc(d)["verdict"] == "pass" and json.loads(before)["verdict"] == "fail"
    p = cli("diagnose", str(d))
    assert p.returncode == 4, said(p)
    assert feature_json(d, "speed") == before
    after = doc(d)
    assert after["exit_code"] == 4 and after["overall"] == "fail (speed)"
    assert heading(d).startswith("# FAIL (speed)") and junit_failures(d) >= 1
    assert "speed: fail (min_speed_ratio decode 10x)" in p.stdout, said(p)


# ---------------------------------------------------------------------------- (c) localize keeps the other sections


PROMPTS = [{"id": f"p{i}", "token_ids": [(5 * i + j * 7 + 1) % 32 for j in range(6)]} for i in range(6)]


def toy_gate(where: Path, *, localize_all: bool) -> str:
    """The toy model, layer 1's MLP scaled in the candidate (BUG=mlp1): the tokens diverge (exit 1);
    [invariance] batch 2, which the toy engine cannot serve (its hello declares no max_in_flight):
    an incomplete section, still one to keep."""
    (where / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    arm = {"kind": "command", "command": ["python", TOY]}
    write_gate(where, name="toy", prompts="p.jsonl", max_tokens=8, top_logprobs=5, policy="strict", output_dir="out",
               **({"localize": "all"} if localize_all else {}),
               reference=arm | {"env": {"BUG": ""}}, candidate=arm | {"env": {"BUG": "mlp1"}},
               invariance={"policy": "strict", "batch": [2]})
    return "gate.toml"


def localised(report: dict) -> dict[str, str]:
    return {p["id"]: json.dumps(p["localization"], sort_keys=True) for p in report["prompts"] if p.get("localization")}


@pytest.mark.parametrize("localize_all", [False, True], ids=["gate-without-localize", "gate-localizes-all"])
def test_localize_then_diagnose_keep_invariance_the_exit_code_and_every_localisation(tmp_path, monkeypatch,
                                                                                     localize_all):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    p = cli("gate", toy_gate(Path("."), localize_all=localize_all))
    assert p.returncode == 1, said(p)
    d = report_dir()
    assert (d / "report.json").is_file(), said(p)
    gate_doc = doc(d)
    inv = feature_json(d, "invariance")
    assert json.loads(inv)["verdict"] == "incomplete" and json.loads(inv)["exit_code"] == 3
    divergent = [x["id"] for x in gate_doc["prompts"] if x.get("first_divergence") is not None]
    assert len(divergent) >= 2, divergent
    target = divergent[1]
    old_locs = localised(gate_doc)
    assert bool(old_locs) is localize_all

    p = cli("localize", str(d), "--prompt", target)
    assert p.returncode == 0 and (d / "report.json").is_file(), said(p)
    after_localize = doc(d)
    assert feature_json(d, "invariance") == inv
    assert after_localize["exit_code"] == gate_doc["exit_code"] == 1  # not improved
    assert after_localize["overall"] == "fail" and heading(d).startswith("# FAIL:")
    locs = localised(after_localize)
    assert target in locs and json.loads(locs[target])["first_beyond"] == "layers.1.mlp", locs.get(target)
    for pid, loc in old_locs.items():  # every other prompt's localisation as the gate wrote it
        if pid != target:
            assert locs.get(pid) == loc, pid
    assert set(locs) == set(old_locs) | {target}

    p = cli("diagnose", str(d))
    assert p.returncode == 1, said(p)
    after_diagnose = doc(d)
    assert feature_json(d, "invariance") == inv
    assert localised(after_diagnose) == locs  # diagnose redoes the tokens, not the localisation
    assert after_diagnose["exit_code"] == 1 and junit_failures(d) >= 1
    assert "INVARIANCE INCOMPLETE (batch-2)" in p.stdout, said(p)


# ---------------------------------------------------------------------------- (d) resume of a finished gate


def test_resume_of_the_finished_gate_exits_5_and_shows_the_invariance_verdict(moved):
    before = (moved / "report.json").read_bytes()
    p = cli("gate", "--resume", str(moved))
    assert p.returncode == 5, said(p)
    assert "had finished" in p.stderr and "invariance fail" in p.stderr, said(p)
    assert "NOT INVARIANT (batch-4), policy strict" in p.stdout, said(p)
    assert (moved / "report.json").read_bytes() == before  # a finished gate's reports are left as they were


def test_resume_after_diagnose_still_exits_5(moved):
    assert cli("diagnose", str(moved)).returncode == 5
    p = cli("gate", "--resume", str(moved))
    assert p.returncode == 5, said(p)
    assert "NOT INVARIANT (batch-4)" in p.stdout, said(p)


# ---------------------------------------------------------------------------- (e) a hostile report.json


def edit(d: Path, change) -> bytes:
    """Apply `change` to report.json's dict, write it back; the written bytes."""
    data = doc(d)
    change(data)
    text = (json.dumps(data, indent=2) + "\n").encode()
    (d / "report.json").write_bytes(text)
    return text


def refused(d: Path, text: bytes, *words: str) -> None:
    """diagnose exits 2 naming report.json (and `words`) and rewrites nothing."""
    md = (d / "report.md").read_bytes()
    p = cli("diagnose", str(d))
    assert p.returncode == 2, said(p)
    message = " ".join(p.stderr.split())
    assert str(d / "report.json") in message, said(p)
    for w in words:
        assert w in message, said(p)
    assert (d / "report.json").read_bytes() == text and (d / "report.md").read_bytes() == md
    assert not (d / "report.md").read_text(encoding="utf-8").startswith("# PASS")


def _says_passed(data: dict) -> None:
    data["features"]["invariance"]["exit_code"] = 0
    data["features"]["invariance"]["verdict"] = "pass"


@pytest.mark.parametrize(("change", "words"), [
    (lambda data: data["features"]["invariance"].update(exit_code=0), ("features.invariance", "exit code 0")),
    (_says_passed, ("features.invariance", "exit code 0")),
    (lambda data: data["features"]["invariance"].pop("section"), ("features", "`section`")),
], ids=["exit-code-0", "verdict-pass-exit-code-0", "section-deleted"])
def test_an_invariance_section_edited_to_pass_is_refused_not_rewritten_as_a_pass(moved, change, words):
    refused(moved, edit(moved, change), *words)


def test_a_section_this_version_cannot_read_back_is_refused_not_dropped(moved):
    def add(data: dict) -> None:
        data["features"]["telepathy"] = {"verdict": "fail", "exit_code": 5, "section": {"minds": 3}}

    refused(moved, edit(moved, add), "features.telepathy", "cannot read back")


@pytest.mark.parametrize("change", [
    lambda data: data["features"].pop("invariance"),
    lambda data: data.update(features={}),
], ids=["invariance-entry-deleted", "features-emptied"])
def test_a_report_json_that_lost_the_invariance_section_is_not_rewritten_as_a_pass(moved, change):
    """report.json edited so the section is gone while its own "exit_code" (5), "overall" ("fail
    (invariance)"), the gate's config ([invariance]) and its sealed gate-state.json (invariance
    fail, exit 5) all say it was there: the rewrite would lose a verdict. Refused (exit 2) or kept
    at 5, never a pass; and the gate still exits 5 on resume."""
    text = edit(moved, change)
    p = cli("diagnose", str(moved))
    assert p.returncode in (2, 5), said(p)  # was: exit 0, "# PASS", and gate-state.json resealed with exit 0
    if p.returncode == 2:
        assert (moved / "report.json").read_bytes() == text
    assert not heading(moved).startswith("# PASS"), heading(moved)
    r = cli("gate", "--resume", str(moved))
    assert r.returncode == 5, said(r)
