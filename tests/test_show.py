"""`strict-gate show REPORT_DIR`: the side-by-side view from report.json and the stored runs."""

from __future__ import annotations

import json

import pytest
from test_html_report import offline_gate
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.report.text import Decoder
from strict_gate.runs.reader import load_run

runner = CliRunner()


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    return offline_gate(tmp_path_factory.mktemp("show"))


def test_show_one_prompt_side_by_side(report_dir):
    rep = json.loads((report_dir / "report.json").read_text())
    entry = next(p for p in rep["prompts"] if p["status"] == "divergent")
    r = runner.invoke(app, ["show", str(report_dir), "--prompt", entry["id"]], terminal_width=160)
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"{entry['id']}  divergent at position {entry['first_divergence']['position']}" in out
    assert "◀ reference" in out and "◀ candidate" in out and "reference gap" in out
    dec = Decoder("bundled:tiny-llama")
    for role in ("reference", "candidate"):
        tokens = load_run(report_dir / role).records[entry["id"]].token_ids
        assert dec.text(tokens).split()[0] in out  # each side's decoded continuation
        assert f"({entry['first_divergence'][role + '_token']})" in out  # its token at the divergence


def test_show_lists_the_non_matching_prompts_with_a_count(report_dir):
    r = runner.invoke(app, ["show", str(report_dir)])
    assert r.exit_code == 0, r.output
    assert "10 of 22 non-matching prompt(s) shown; 12 more not shown" in r.output.replace("\n", " ")
    r = runner.invoke(app, ["show", str(report_dir), "--prompt", "prose-002"])
    assert r.exit_code == 0 and "prose-002  match" in r.output


def test_show_refuses_an_unknown_prompt_or_a_directory_without_a_report(report_dir, tmp_path):
    r = runner.invoke(app, ["show", str(report_dir), "--prompt", "no-such-prompt"])
    assert r.exit_code == 2 and "no prompt 'no-such-prompt'" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["show", str(tmp_path)])
    assert r.exit_code == 2 and "no report.json" in r.output
