"""Hostile engines against the speculative variant of [invariance], end to end through the CLI.

Every engine is a real process (tests/engines/spec_engine.py) speaking the command protocol:
one that declares "speculative" and ignores it (silently, or saying it drafted nothing), one
that lies about its acceptance (counts no run could have), one that speculates only on some
requests (and flips a near-tie there), one that speculates when nobody asked, one that never
declared the capability. An honest one passes. No mock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_gate

HERE = Path(__file__).resolve().parent
ENGINE = str(HERE / "engines" / "spec_engine.py")
NGRAM = {"speculative": [{"method": "ngram", "num_speculative_tokens": 3}]}


def _gate(tmp_path: Path, mode: str, policy: str = "strict") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]}) + "\n"
                               for i in range(6)), encoding="utf-8")
    arm = {"kind": "command", "command": ["python", ENGINE, "--mode", mode], "timeout_s": 5.0}
    reference = {"kind": "command", "command": ["python", ENGINE]}
    return write_gate(tmp_path, prompts=str(prompts), max_tokens=4, top_logprobs=2, output_dir=str(tmp_path / "out"),
                      reference=reference, candidate=arm, invariance={"policy": policy} | NGRAM)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"COLUMNS": "200"})


def _variant(tmp_path: Path) -> dict:
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/invariance.json")]
    (v,) = doc["invariance"]["variants"]
    return v


def test_an_honest_speculator_passes_with_its_counts(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "honest")))
    assert p.returncode == 0, p.stdout + p.stderr
    v = _variant(tmp_path)
    assert v["name"] == "speculative-ngram-3" and v["verdict"] == "pass" and v["exact"]
    assert v["acceptance"] | {} == v["acceptance"] and v["acceptance"]["drafted"] == 6 * 3  # 1 step of K=3 each
    assert v["acceptance"]["accepted"] == 6 and v["acceptance"]["mean_accepted_length"] == 2.0
    assert "drafted 18" in p.stdout and "equal, 6/6 exact" in p.stdout


def test_an_engine_that_never_declared_it_is_never_a_pass(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "undeclared")))
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variant(tmp_path)
    assert v["verdict"] == "incomplete"
    assert any('lack "speculative"' in x or "serves speculative" in x for x in v["problems"]), v["problems"]
    # informational: the exit code is the token verdict's, and the variant is still not a pass
    p = _cli("invariance", str(_gate(tmp_path / "i", "undeclared", "informational")))
    assert p.returncode == 0 and _variant(tmp_path / "i")["verdict"] == "incomplete"
    assert "INVARIANCE INCOMPLETE" in p.stdout


def test_claiming_it_and_ignoring_it_silently_is_not_a_pass(tmp_path):
    """The tokens cannot tell (a non-speculating engine is lossless too), and no reply says it
    drafted anything: the report claims no acceptance, and the variant, whose speculation was
    never shown to run, is incomplete (exit 3), as one that says it drafted nothing is."""
    p = _cli("invariance", str(_gate(tmp_path, "silent")))
    assert p.returncode == 3, p.stdout + p.stderr  # before: exit 0, a pass with acceptance unknown
    v = _variant(tmp_path)
    assert v["verdict"] == "incomplete" and "no reply carried acceptance counts" in v["problems"][0]
    assert v["acceptance"]["replies"] == 0 and v["acceptance"]["replies_without"] == 6
    assert "drafted unknown" in p.stdout


@pytest.mark.parametrize("mode, label", [("lossy", "not its own argmax"), ("lossy-claimed", "flipped a near-tie")])
@pytest.mark.parametrize("policy", ["strict", "near-tie"])
def test_accepting_a_lossy_draft_fails(tmp_path, mode, label, policy):
    """A draft the verifier ranks 0.3 nats below its argmax, accepted (a lossy rule) with honest
    counts: with the verifier's logprobs the token is not its own argmax; claimed as the top-1 it
    is another token than the plain run's, inside the band. Either fails (exit 5), a near-tie
    policy too (already so before issue 36: the exact rule and the greedy check)."""
    path = _gate(tmp_path, mode, policy)
    path.write_text(path.read_text().replace(f'"--mode", "{mode}"', f'"--mode", "{mode}", "--gap", "0.3"'))
    p = _cli("invariance", str(path))
    assert p.returncode == 5, p.stdout + p.stderr
    v = _variant(tmp_path)
    assert v["verdict"] == "fail" and v["acceptance"]["accepted"] > 0
    assert all(label in m["label"] for m in v["divergences"]), v["divergences"]


def test_claiming_it_and_drafting_nothing_is_not_a_pass(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "idle")))
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variant(tmp_path)
    assert v["verdict"] == "incomplete" and "drafted no token" in v["problems"][0]


@pytest.mark.parametrize(("mode", "rule"), [("lie", "rule: accepted <= drafted"),
                                            ("overclaim", "at most emitted - 1 are accepted drafts")])
def test_lying_about_acceptance_is_an_engine_failure_naming_the_rule(tmp_path, mode, rule):
    p = _cli("invariance", str(_gate(tmp_path, mode)))
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variant(tmp_path)
    assert v["verdict"] == "incomplete" and any(rule in x for x in v["problems"]), v["problems"]


@pytest.mark.parametrize("policy", ["strict", "near-tie"])
def test_speculating_on_some_requests_only_is_caught_where_it_flips(tmp_path, policy):
    """It flips a near-tie (0.01 nats) only on the requests it speculates on: a near-tie policy
    lets a batch variant flip that, never a speculative one."""
    p = _cli("invariance", str(_gate(tmp_path, "some", policy)))
    assert p.returncode == 5, p.stdout + p.stderr
    v = _variant(tmp_path)
    moved = {m["id"]: m for m in v["divergences"]}
    assert set(moved) == {"q1", "q3", "q5"} and {m["position"] for m in moved.values()} == {2}
    assert all(m["status"] == "near_tie" and "flips none" in m["label"] for m in moved.values())
    assert v["acceptance"]["replies"] == 3 and v["acceptance"]["replies_without"] == 3
    assert "q1: speculation flipped a near-tie (a lossless speculator flips none) at position 2" in p.stdout
    assert "(3/6 replies)" in p.stdout


def test_counts_on_a_request_that_did_not_ask_break_the_protocol(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "unasked")))
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variant(tmp_path)
    assert "did not ask for speculative decoding" in v["problems"][0]
