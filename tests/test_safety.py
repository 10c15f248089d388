"""Distrust every engine: no id, token or engine error can break a report or a terminal."""

from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from helpers import rec, step, write_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.gate import judge
from strict_gate.records import EngineInfo, Manifest, Run, Sampling, Timing, now_iso
from strict_gate.report import write_reports
from strict_gate.report.console import print_result

FAKE = Path(__file__).parent / "engines" / "fake_engine.py"
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # anything but a newline
runner = CliRunner()


def console_text(result) -> str:
    return result.output + (getattr(result, "stderr", "") or "")


def prompts_file(tmp_path: Path, ids=("p0", "p1", "p2")) -> Path:
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"id": pid, "token_ids": [1, 20 + i, 30]}) + "\n" for i, pid in enumerate(ids)))
    return p


def fake_arm(mode="good", *extra: str) -> str:
    argv = [sys.executable, str(FAKE), "--mode", mode, *extra]
    return f'kind = "command"\ncommand = {json.dumps(argv)}\ntimeout_s = 20\nstartup_timeout_s = 20\n'


def gate_file(tmp_path: Path, reference: str, candidate: str, *, name="safety", out=None, prompts="p.jsonl") -> Path:
    g = tmp_path / "gate.toml"
    g.write_text(
        f'name = {json.dumps(name)}\nprompts = "{prompts}"\nmax_tokens = 3\ntop_logprobs = 2\npolicy = "strict"\n'
        f'output_dir = {json.dumps(str(out or tmp_path / "reports"))}\n'
        f"[reference]\n{reference}[candidate]\n{candidate}"
    )
    return g


# ---------------------------------------------------------------- 6. escaping everywhere

NASTY = "p\x1b[31mred\x00nul]]><b>&amp;\x85\x7f\ufffe|`\n"


def strict_json(text: str):
    def no_constant(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constant)


def assert_reports_safe(report_dir: Path, console: str = "") -> None:
    ET.fromstring((report_dir / "junit.xml").read_text(encoding="utf-8"))
    for name in ("report.md", "report.html", "junit.xml"):
        text = (report_dir / name).read_text(encoding="utf-8")
        assert not RAW_CONTROL.search(text), (name, RAW_CONTROL.findall(text))
    strict_json((report_dir / "report.json").read_text(encoding="utf-8"))
    assert not RAW_CONTROL.search(console), RAW_CONTROL.findall(console)


def test_control_characters_in_ids_and_engine_errors(tmp_path):
    prompts_file(tmp_path, ids=(NASTY, "ok\x00", "plain"))
    canned = tmp_path / "canned.jsonl"
    canned.write_text(json.dumps({"error": "engine says \x1b[2J\x00 boom ]]> \x07"}) + "\n")
    r = runner.invoke(app, ["gate", str(gate_file(tmp_path, fake_arm(), fake_arm("good", "--canned", str(canned))))])
    assert r.exit_code == 3, r.output  # one prompt errored: incomplete
    (report_dir,) = (tmp_path / "reports").iterdir()
    assert_reports_safe(report_dir, console_text(r))
    report = json.loads((report_dir / "report.json").read_text())
    assert report["prompts"][0]["id"] == NASTY  # the data keeps the exact id; only renderings escape
    suite = ET.parse(report_dir / "junit.xml").getroot()
    assert "\\x1b" in suite.find("testcase/error").text
    assert "p\\x1b\\[31mred\\x00nul" in (report_dir / "report.md").read_text()


def test_report_json_is_strict_with_non_finite_timings_and_logprobs(tmp_path):
    inf = float("inf")
    ref = [replace(rec("p0", [5, 6]), timing=Timing(ttft_s=float("nan"), total_s=inf)),
           rec("p1", [7, 8], tops=[step((7, -0.1), (9, -inf)), step((8, -0.1), (3, -2.0))])]
    cand = [rec("p0", [5, 6]), rec("p1", [9, 8], tops=[step((9, -0.1), (7, -inf)), step((8, -0.1), (3, -2.0))])]
    write_run(tmp_path / "ref", ref, max_tokens=2)
    write_run(tmp_path / "cand", cand, max_tokens=2)
    r = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    report = strict_json((tmp_path / "out" / "report.json").read_text())
    assert report["prompts"][1]["first_divergence"]["reference_gap"] is None  # inf -> null
    assert_reports_safe(tmp_path / "out", console_text(r))


def _result(name: str, pid: str, error: str, problem: str):
    def run(records) -> Run:
        m = Manifest(engine=EngineInfo(kind="hand", model=name), prompt_set={"sha256": "0" * 64},
                     sampling=Sampling(2, 2), created=now_iso(), status="complete")
        return Run("run", m, {r.id: r for r in records})

    ref = run([rec(pid, [5, 6]), rec("b", [5, 6])])
    cand = run([rec(pid, [], error=error), rec("b", [5, 7])])
    return judge(name, {"name": name, "sha256": "0" * 64}, Sampling(2, 2), ref, cand, prompt_ids=[pid, "b"],
                 policy="strict", band=0.5, problems=[problem])


_PIECES = st.one_of(st.characters(), st.sampled_from(["\x00", "\x1b", "\x85", "]]>", "\r", "\t", "\ufffe", "&lt;"]))
ANY_TEXT = st.lists(_PIECES, min_size=1, max_size=20).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=ANY_TEXT, pid=ANY_TEXT, error=ANY_TEXT, problem=ANY_TEXT)
def test_any_text_in_ids_and_errors_keeps_every_format_safe(tmp_path, name, pid, error, problem):
    if pid == "b":
        return
    result = _result(name, pid, error, problem)
    out = tmp_path / "r"
    write_reports(result, out)
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=200), report_dir=str(out))
    assert_reports_safe(out, buf.getvalue())
