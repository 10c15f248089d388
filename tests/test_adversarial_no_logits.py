"""An engine whose greedy loop gives no logits (docs/engine-protocol.md, "A greedy loop without
logits"): what the gate can and cannot say, on real engine processes (tests/engines/cascade_engine.py,
its candidate with `--chosen-only`: each step lists only its chosen token and that token's logprob,
no `score`; with `--no-logprobs`: token ids and nothing else).

Hostile cases: a near-tie never passes two-sided without the candidate's own gap; the one-sided
policy still fails a real divergence and a garbage tail; a reply without logprobs in a gate is an
engine failure, never a pass; a token-only run is judged token for token only, and never against a
run with logprobs. Each runs as a user runs it: a working directory, relative paths, the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

ENGINE = Path(__file__).parent / "engines" / "cascade_engine.py"
PROMPTS = {"p0": [1, 2, 3], "p1": [4, 5, 6, 7]}


def _here(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINE, "cascade_engine.py")
    Path("prompts.jsonl").write_text("".join(json.dumps({"id": i, "token_ids": t}) + "\n" for i, t in PROMPTS.items()))


def _gate(tmp_path: Path, monkeypatch, *cand: str, policy: str) -> tuple[int, str, dict | None]:
    _here(tmp_path, monkeypatch)
    write_gate(Path("."), name="no-logits", prompts="prompts.jsonl", max_tokens=8, top_logprobs=5, policy=policy,
               band=0.5, output_dir="reports",
               reference={"kind": "command", "command": ["python", "cascade_engine.py", "reference"]},
               candidate={"kind": "command", "command": ["python", "cascade_engine.py", "candidate", *cand]})
    r = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=200)
    (d,) = [p for p in Path("reports").iterdir() if p.is_dir()]
    report = json.loads((d / "report.json").read_text()) if (d / "report.json").is_file() else None
    return r.exit_code, r.output, report


def _status(report: dict) -> dict[str, str]:
    return {p["id"]: p["status"] for p in report["prompts"]}


def test_a_chosen_only_near_tie_is_divergent_two_sided(tmp_path, monkeypatch):
    code, out, report = _gate(tmp_path, monkeypatch, "--chosen-only", "--flip", "2", policy="near-tie")
    assert code == 1, out
    assert "candidate gap unknown" in out and "cannot score" in out
    assert report is not None and set(_status(report).values()) == {"divergent"}


def test_a_chosen_only_near_tie_passes_one_sided_and_says_so(tmp_path, monkeypatch):
    code, out, report = _gate(tmp_path, monkeypatch, "--chosen-only", "--flip", "2", policy="near-tie-reference-only")
    assert code == 0, out
    assert report is not None and report["exit_code"] == 0
    assert any("one-sided and weaker" in n for n in report["notes"]), report["notes"]


def test_one_sided_still_fails_a_garbage_tail_after_the_tie(tmp_path, monkeypatch):
    code, out, _ = _gate(tmp_path, monkeypatch, "--chosen-only", "--flip", "2", "--garbage",
                         policy="near-tie-reference-only")
    assert code == 1, out
    assert "at a later position 3" in out and "4.9000 > band 0.5" in out


def test_one_sided_still_fails_a_real_divergence(tmp_path, monkeypatch):
    """The candidate claims a token 2 nats below the reference's argmax as its own top-1: with one
    pair a step the audit cannot see it, the reference's re-scoring does."""
    code, out, _ = _gate(tmp_path, monkeypatch, "--chosen-only", "--off", "3", policy="near-tie-reference-only")
    assert code == 1, out
    assert "reference gap 2.0000 > band 0.5 at position 3" in out


def test_a_gate_reply_without_logprobs_is_an_engine_failure(tmp_path, monkeypatch):
    code, out, report = _gate(tmp_path, monkeypatch, "--no-logprobs", policy="near-tie-reference-only")
    assert code == 3, out
    assert '"top_logprobs" is missing (asked for top 5)' in out and "Traceback" not in out
    assert report is None or report["exit_code"] == 3


def _run(engine: str, out: str, k: int = 0) -> None:
    r = CliRunner().invoke(app, ["run", engine, "--prompts", "prompts.jsonl", "--out", out, "--max-tokens", "8",
                                 "--top-logprobs", str(k)], terminal_width=200)
    assert r.exit_code == 0, r.output


def _token_only_runs(tmp_path: Path, monkeypatch, *cand: str) -> None:
    _here(tmp_path, monkeypatch)
    Path("ref.toml").write_text('kind = "command"\ncommand = ["python", "cascade_engine.py", "reference"]\n')
    args = ", ".join(json.dumps(a) for a in ("candidate", "--no-logprobs", *cand))
    Path("cand.toml").write_text(f'kind = "command"\ncommand = ["python", "cascade_engine.py", {args}]\n')
    _run("ref.toml", "runs/ref")
    _run("cand.toml", "runs/cand")


def test_token_only_runs_pass_strict_only_when_every_token_is_equal(tmp_path, monkeypatch):
    _token_only_runs(tmp_path, monkeypatch)
    r = CliRunner().invoke(app, ["compare", "runs/ref", "runs/cand", "--policy", "strict", "-p", "prompts.jsonl"],
                           terminal_width=200)
    assert r.exit_code == 0 and "prompts exact 2/2" in r.output, r.output


def test_a_token_only_flip_is_divergent_under_every_policy(tmp_path, monkeypatch):
    _token_only_runs(tmp_path, monkeypatch, "--flip", "2")
    for policy in ("strict", "near-tie", "near-tie-reference-only"):
        r = CliRunner().invoke(app, ["compare", "runs/ref", "runs/cand", "--policy", policy], terminal_width=200)
        assert r.exit_code == 1, (policy, r.output)
        assert "PASS" not in r.output and "gap unknown" in r.output, (policy, r.output)


def test_a_token_only_run_is_never_compared_with_a_run_that_has_logprobs(tmp_path, monkeypatch):
    _token_only_runs(tmp_path, monkeypatch)
    _run("ref.toml", "runs/ref5", k=5)
    r = CliRunner().invoke(app, ["compare", "runs/ref5", "runs/cand"], terminal_width=200)
    assert r.exit_code == 2 and "not comparable: top_logprobs is 5" in r.output, r.output
