"""What a gate's reports say about its engines: an arm that never started (said once, not as
one missing row per prompt), and a [rescorer] arm (its log in the report directory, its
versions in the engines section)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from helpers import toml_text, write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

FAKE = Path(__file__).resolve().parent / "engines" / "fake_engine.py"


def _fake(*args: str) -> dict[str, Any]:
    return {"kind": "command", "command": [sys.executable, FAKE, *args]}


def _gate(tmp_path: Path, reference: dict, candidate: dict, n: int = 12, **tables: dict) -> Path:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i:02d}", "token_ids": [1, 20 + i]}) + "\n" for i in range(n)))
    return write_gate(tmp_path, name="g", prompts="p.jsonl", max_tokens=2, top_logprobs=2, policy="strict",
                      output_dir=tmp_path / "r", reference=reference, candidate=candidate, **tables)


def _report_dir(tmp_path: Path) -> Path:
    (d,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    return d


def test_an_engine_that_never_starts_is_said_once_and_not_as_128_missing_rows(tmp_path):
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('cannot load weights'); sys.exit(3)"]
    dead = {"kind": "command", "command": argv}
    result = CliRunner().invoke(app, ["gate", str(_gate(tmp_path, _fake(), dead))], terminal_width=100)
    assert result.exit_code == 3, result.output
    out = result.output
    assert out.count("never started") == 1 and "cannot load weights" in out
    assert "while on prompt" not in out
    assert "12 prompt(s) missing" in out and "p05" not in out  # a count and 5 ids, not 12 rows
    d = _report_dir(tmp_path)
    md = (d / "report.md").read_text()
    assert md.count("never started") == 1 and "while on prompt" not in md
    assert "| p00 |" not in md and "12 prompt(s) missing" in md
    html = (d / "report.html").read_text()
    assert "12 prompt(s) missing" in html and ">p11<" not in html
    report = json.loads((d / "report.json").read_text())
    assert [p["status"] for p in report["prompts"]] == ["missing"] * 12  # the JSON stays complete
    manifest = json.loads((d / "candidate" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_prompt"] is None
    assert "never started" in manifest["error"]


def test_rescorer_logs_into_the_report_directory_and_is_named_in_the_engines(tmp_path):
    canned = tmp_path / "canned.jsonl"  # the candidate's second token is off the reference's top-k
    canned.write_text(json.dumps({"id": "x", "token_ids": [21, 5000], "finish_reason": "length",
                                  "top_logprobs": [[[21, -0.1], [1021, -5.0]], [[5000, -0.2], [7, -3.0]]]}) + "\n")
    gate = _gate(tmp_path, _fake("--mode", "no_score"), _fake("--canned", str(canned)),
                 rescorer=_fake("--score-model"), n=1)  # the reference's model: it proves itself
    result = CliRunner().invoke(app, ["gate", str(gate)], terminal_width=100)
    assert result.exit_code == 1, result.output
    d = _report_dir(tmp_path)
    report = json.loads((d / "report.json").read_text())
    assert report["prompts"][0]["diagnosis"] is not None
    rescorer = report["engines"]["rescorer"]
    assert rescorer["kind"] == "command" and rescorer["versions"]["fake"] == "0.0.1"
    assert rescorer["options"]["log_used"] == str(d / "rescorer.log")
    assert "fake engine good starting" in (d / "rescorer.log").read_text()
    assert "| rescorer | command |" in (d / "report.md").read_text()
    html = (d / "report.html").read_text()
    assert "<td>rescorer</td>" in html and f"rescorer log: <code>{d / 'rescorer.log'}</code>" in html


def test_run_refuses_max_tokens_below_one(tmp_path):
    engine = tmp_path / "engine.toml"
    engine.write_text(toml_text(_fake()))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p", "token_ids": [1, 2]}) + "\n")
    result = CliRunner().invoke(app, ["run", str(engine), "--prompts", str(prompts), "--out", str(tmp_path / "o"),
                                      "--max-tokens", "0"])
    assert result.exit_code == 2 and not (tmp_path / "o").exists()


def test_a_rescorer_that_cannot_start_is_started_once_not_once_per_divergent_prompt(tmp_path):
    canned = tmp_path / "canned.jsonl"  # three prompts, each off the reference's top-k at position 1
    canned.write_text("".join(json.dumps({"id": "x", "token_ids": [21, 5000], "finish_reason": "length",
                                          "top_logprobs": [[[21, -0.1], [1021, -5.0]], [[5000, -0.2], [7, -3.0]]]})
                              + "\n" for _ in range(3)))
    starts = tmp_path / "starts"
    argv = [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('start\\n'); raise SystemExit(3)"]
    gate = _gate(tmp_path, _fake("--mode", "no_score"), _fake("--canned", str(canned)),
                 rescorer={"kind": "command", "command": argv}, n=3)
    result = CliRunner().invoke(app, ["gate", str(gate)], terminal_width=100)
    assert result.exit_code == 1, result.output  # the divergences decide; a failed re-score never does
    assert starts.read_text().count("start") == 1
    report = json.loads((_report_dir(tmp_path) / "report.json").read_text())
    diagnoses = [p["diagnosis"] for p in report["prompts"]]
    assert len(diagnoses) == 3 and all("did not start" in d["error"] for d in diagnoses), diagnoses
