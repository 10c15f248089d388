"""Distrust every engine: secrets are never written, output is never half-replaced or written
outside its directory, and no id, token or engine error can break a report or a terminal."""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from engines.fake_openai_server import Mode
from helpers import gate_text, rec, step, toml_text, write_gate, write_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.core.redact import REDACTED, is_secret_name, redact_toml
from strict_gate.gate.judgement import judge
from strict_gate.judge.spec import GateSpec, PromptSetRef
from strict_gate.report import write_reports
from strict_gate.report.console import print_result
from strict_gate.runs.records import EngineInfo, Manifest, Run, Sampling, Timing, now_iso

FAKE = Path(__file__).parent / "engines" / "fake_engine.py"
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # anything but a newline
runner = CliRunner()


def console_text(result) -> str:
    return result.output + (getattr(result, "stderr", "") or "")


def prompts_file(tmp_path: Path, ids=("p0", "p1", "p2")) -> Path:
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"id": pid, "token_ids": [1, 20 + i, 30]}) + "\n" for i, pid in enumerate(ids)))
    return p


def fake_arm(mode="good", *extra: str) -> dict[str, Any]:
    argv = [sys.executable, str(FAKE), "--mode", mode, *extra]
    return {"kind": "command", "command": argv, "timeout_s": 20, "startup_timeout_s": 20}


def gate_file(tmp_path: Path, reference: dict, candidate: dict, *, name="safety", out=None, prompts="p.jsonl") -> Path:
    return write_gate(tmp_path, name=name, prompts=prompts, max_tokens=3, top_logprobs=2, policy="strict",
                      output_dir=out or tmp_path / "reports", reference=reference, candidate=candidate)


# ---------------------------------------------------------------- 3. secrets never written


@pytest.fixture
def echo_server(fake_openai):
    """An OpenAI-compatible server that rejects every completion, quoting the key it was sent."""
    return fake_openai(Mode.STATUS, status=400, quote_auth=True).url


def test_secrets_never_reach_the_report_dir_or_the_console(tmp_path, echo_server, monkeypatch):
    """A secret-named [reference.env] entry that the engine echoes back (hello versions), and an
    openai key that the server quotes in every error: neither is in any file or on the console."""
    env_secret = "hf_" + secrets.token_hex(12)
    api_key = "sk-" + secrets.token_hex(12)
    monkeypatch.setenv("SG_SAFETY_KEY", api_key)
    prompts_file(tmp_path)
    # The engine logs the token on stderr (into engine.log) and echoes it in its hello.
    logs_it = ("import os, runpy, sys; print('token', os.environ['HF_TOKEN'], file=sys.stderr, flush=True); "
               f"sys.argv = [{str(FAKE)!r}]; runpy.run_path({str(FAKE)!r}, run_name='__main__')")
    reference = {"kind": "command", "command": [sys.executable, "-c", logs_it],
                 "env": {"HF_TOKEN": env_secret, "FAKE_ECHO_ENV": "HF_TOKEN", "SHORT_AUTH": "on"}}
    candidate = {"kind": "openai", "base_url": echo_server, "api_key_env": "SG_SAFETY_KEY", "retries": 0}
    result = runner.invoke(app, ["gate", str(gate_file(tmp_path, reference, candidate))])
    assert result.exit_code == 3, result.output  # every candidate prompt errored
    (report_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    files = [f for f in report_dir.rglob("*") if f.is_file()]
    assert {"report.json", "report.md", "report.html", "junit.xml", "gate.toml", "manifest.json"} <= {f.name for f in files}
    for secret in (env_secret, api_key):
        leaks = [str(f) for f in files if secret in f.read_text(errors="replace")]
        assert leaks == [], leaks
        assert secret not in console_text(result)
    assert f"token {REDACTED}" in (report_dir / "reference" / "engine.log").read_text()
    report = json.loads((report_dir / "report.json").read_text())
    env = report["engines"]["reference"]["env"]
    assert env == {"HF_TOKEN": REDACTED, "FAKE_ECHO_ENV": "HF_TOKEN", "SHORT_AUTH": REDACTED}
    assert report["engines"]["reference"]["versions"]["HF_TOKEN"] == REDACTED  # the echoed value
    assert any(REDACTED in p["reason"] for p in report["prompts"])  # the server's error, key scrubbed
    copied = tomllib.loads((report_dir / "gate.toml").read_text())
    assert copied["reference"]["env"]["HF_TOKEN"] == REDACTED and copied["candidate"]["api_key_env"] == "SG_SAFETY_KEY"


def test_the_engine_still_gets_the_real_secret(tmp_path):
    from strict_gate.engines.command.engine import CommandEngine, CommandOptions

    value = "ghp_" + secrets.token_hex(10)
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(FAKE)]), env={"GH_TOKEN": value, "FAKE_ECHO_ENV": "GH_TOKEN"},
                        base_dir=tmp_path)
    eng.log_path = tmp_path / "engine.log"
    try:
        eng.start()
        assert eng.hello["versions"]["GH_TOKEN"] == value
        assert eng.info().env["GH_TOKEN"] == REDACTED
    finally:
        eng.close()


@pytest.mark.parametrize("name,secret", [
    ("HF_TOKEN", True), ("openai_api_key", True), ("DB_PASSWD", True), ("AWS_SESSION_TOKEN", True),
    ("MY_Auth_HEADER", True), ("GOOGLE_APPLICATION_CREDENTIALS", True), ("COOKIE", True),
    ("DEVICE_KDA", False), ("KDA_CHUNK_PREFILL", False), ("CUDA_VISIBLE_DEVICES", False), ("VLLM_USE_V1", False),
])
def test_secret_name_rule(name, secret):
    assert is_secret_name(name) is secret


def test_redacted_gate_toml_is_valid_and_unchanged_without_secrets():
    plain = '# comment\nname = "x"\n[reference]\nkind = "hf"\n[reference.env]\nDEVICE_KDA = "1"\n'
    assert redact_toml(plain) == plain
    text = ('name = "x"\n[candidate]\nkind = "command"\ncommand = ["a", "b\\"c"]\n'
            'env = { API_KEY = "k\\u0000\\"y", N = 3, OK = true }\nextra_body = {a = [1.5, {b = "c"}]}\n')
    out = redact_toml(text)
    data = tomllib.loads(out)
    assert data["candidate"]["env"] == {"API_KEY": REDACTED, "N": 3, "OK": True}
    assert data["candidate"]["command"] == ["a", 'b"c'] and data["candidate"]["extra_body"] == {"a": [1.5, {"b": "c"}]}


def test_a_redacted_entry_read_back_is_not_applied(tmp_path, monkeypatch):
    """strict-gate diagnose reloads the report's gate.toml: the marker is never applied, the engine
    gets the real variable, exported as the gate ran with it (unset, the config is refused since
    issue 50: test_adversarial_rescorer_proof)."""
    from strict_gate.gate.config import parse_gate_config

    monkeypatch.setenv("HF_TOKEN", "the-real-one")
    text = gate_text(name="x", prompts="p.jsonl",
                     reference={"kind": "recorded", "path": "r", "env": {"HF_TOKEN": REDACTED, "DEVICE_KDA": "1"}})
    cfg = parse_gate_config(text, str(tmp_path / "gate.toml"), require_candidate=False)
    assert cfg.reference.env == {"HF_TOKEN": "the-real-one", "DEVICE_KDA": "1"}


# ---------------------------------------------------------------- 5. output safety


def run_cmd(tmp_path: Path, out: Path, engine: dict, *extra: str):
    (tmp_path / "engine.toml").write_text(toml_text(engine))
    return runner.invoke(app, ["run", str(tmp_path / "engine.toml"), "--prompts", str(prompts_file(tmp_path)),
                               "--out", str(out), "--max-tokens", "2", "--top-logprobs", "2", *extra])


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def test_run_out_refuses_a_complete_run_without_force(tmp_path):
    out = tmp_path / "run"
    assert run_cmd(tmp_path, out, fake_arm()).exit_code == 0
    before = (out / "records.jsonl").read_text()
    r = run_cmd(tmp_path, out, {"kind": "command", "command": ["no-such-engine-binary"]})
    assert r.exit_code == 2 and "--force" in r.output, r.output
    assert manifest(out)["status"] == "complete" and (out / "records.jsonl").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".run", "run"))) == ["run"]


def test_run_out_failure_keeps_the_previous_complete_run(tmp_path):
    out = tmp_path / "run"
    assert run_cmd(tmp_path, out, fake_arm()).exit_code == 0
    r = run_cmd(tmp_path, out, {"kind": "command", "command": ["no-such-engine-binary"]}, "--force")
    assert r.exit_code == 2, r.output
    assert manifest(out)["status"] == "complete" and manifest(out)["records"] == 3
    (failed,) = tmp_path.glob("run.failed-*")
    assert manifest(failed)["status"] == "failed" and str(failed) in r.output.replace("\n", "")
    r = run_cmd(tmp_path, out, fake_arm("exit", "--after", "1"), "--force")
    assert r.exit_code == 3 and manifest(out)["records"] == 3
    assert not list(tmp_path.glob(".run.*"))  # no staging directory left behind


def test_run_out_force_replaces_and_a_failed_run_is_kept_when_nothing_was_there(tmp_path):
    out = tmp_path / "run"
    assert run_cmd(tmp_path, out, fake_arm("exit", "--after", "1")).exit_code == 3
    assert manifest(out)["status"] == "failed" and manifest(out)["records"] == 1
    assert run_cmd(tmp_path, out, fake_arm()).exit_code == 0  # a failed run is replaced without --force
    first = manifest(out)["created"]
    assert run_cmd(tmp_path, out, fake_arm(), "--force").exit_code == 0
    assert manifest(out)["status"] == "complete" and (out / "records.jsonl").exists()
    assert ".run.tmp-" not in (out / "manifest.json").read_text()  # the log is named where it ended up
    assert first <= manifest(out)["created"]


def test_capture_refuses_a_complete_baseline_without_force(tmp_path):
    prompts_file(tmp_path)
    g = write_gate(tmp_path, file="cap.toml", name="cap", prompts="p.jsonl", max_tokens=2, top_logprobs=2, reference=fake_arm())
    out = tmp_path / "base"
    assert runner.invoke(app, ["capture", str(g), "--runs", "2", "--out", str(out)]).exit_code == 0
    r = runner.invoke(app, ["capture", str(g), "--runs", "2", "--out", str(out)])
    assert r.exit_code == 2 and "--force" in r.output
    assert runner.invoke(app, ["capture", str(g), "--runs", "2", "--out", str(out), "--force"]).exit_code == 0
    assert manifest(out)["runs"] == 2


def test_gate_name_cannot_leave_the_output_dir(tmp_path):
    prompts_file(tmp_path)
    out = tmp_path / "deep" / "reports"
    r = runner.invoke(app, ["gate", str(gate_file(tmp_path, fake_arm(), fake_arm(), name="../../../escaped/x", out=out))])
    assert r.exit_code == 0, r.output
    (report_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", report_dir.name) and (report_dir / "report.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "gate.toml", "p.jsonl"]
    assert json.loads((report_dir / "report.json").read_text())["name"] == "../../../escaped/x"


def _marker_arm(marker: Path) -> dict[str, Any]:
    """An engine that leaves a marker file if it is ever started."""
    code = f"import pathlib; pathlib.Path({str(marker)!r}).touch()"
    return {"kind": "command", "command": [sys.executable, "-c", code], "startup_timeout_s": 5}


@pytest.mark.parametrize("where", ["file", "under_file", "read_only"])
def test_unwritable_output_dir_is_exit_2_before_any_engine_starts(tmp_path, where):
    prompts_file(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    if where == "read_only":
        if os.geteuid() == 0:  # root writes through mode bits; /proc refuses even root
            out = Path("/proc/strict-gate-reports")
        else:
            ro = tmp_path / "ro"
            ro.mkdir()
            ro.chmod(0o555)
            out = ro / "reports"
    else:
        out = blocker if where == "file" else blocker / "reports"
    marker = tmp_path / "started"
    r = runner.invoke(app, ["gate", str(gate_file(tmp_path, _marker_arm(marker), _marker_arm(marker), out=out))])
    assert r.exit_code == 2, r.output
    assert str(out if where != "under_file" else out) in r.output.replace("\n", "") and "Traceback" not in r.output
    assert not marker.exists()
    r = run_cmd(tmp_path, blocker / "run", _marker_arm(marker))
    assert r.exit_code == 2 and "Traceback" not in r.output and not marker.exists(), r.output


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "dir", "huge"])
def test_prompt_file_must_be_a_bounded_regular_file(tmp_path, special, monkeypatch):
    if special == "fifo":
        path = tmp_path / "fifo.jsonl"
        os.mkfifo(path)
    elif special == "dir":
        path = tmp_path
    elif special == "huge":
        import strict_gate.runs.prompts

        monkeypatch.setattr(strict_gate.runs.prompts, "MAX_PROMPT_BYTES", 10)
        path = prompts_file(tmp_path)
    else:
        path = Path(special)
    r = runner.invoke(app, ["prompts", str(path)])  # a read would never end: the check comes first
    assert r.exit_code == 2 and str(path) in r.output, r.output
    marker = tmp_path / "started"
    g = gate_file(tmp_path, _marker_arm(marker), _marker_arm(marker), prompts=str(path))
    assert runner.invoke(app, ["gate", str(g)]).exit_code == 2 and not marker.exists()


@pytest.mark.parametrize("command", ["gate", "capture", "run"])
def test_config_file_must_be_a_regular_file(command):
    args = ["--prompts", "p.jsonl", "--out", "never"] if command == "run" else []
    r = runner.invoke(app, [command, "/dev/zero", *args])
    assert r.exit_code == 2 and "/dev/zero" in r.output and "regular file" in r.output, r.output


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
    (report_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    assert_reports_safe(report_dir, console_text(r))
    report = json.loads((report_dir / "report.json").read_text())
    assert report["prompts"][0]["id"] == NASTY  # the data keeps the exact id; only renderings escape
    suite = ET.parse(report_dir / "junit.xml").getroot()
    assert "\\x1b" in suite.find("testcase/error").text
    assert "p\\x1b\\[31mred\\x00nul" in (report_dir / "report.md").read_text()


def test_report_json_is_strict_with_non_finite_timings_and_logprobs(tmp_path):
    inf = float("inf")
    ref = [replace(rec("p0", [5, 6]), timing=Timing(ttft_s=float("nan"), total_s=inf)),
           rec("p1", [7, 8], tops=[step((7, -0.1), (9, -0.3)), step((8, -0.1), (3, -2.0))])]
    cand = [rec("p0", [5, 6]), rec("p1", [9, 8], tops=[step((9, -0.1), (7, -0.2)), step((8, -0.1), (3, -2.0))])]
    write_run(tmp_path / "ref", ref, max_tokens=2)
    write_run(tmp_path / "cand", cand, max_tokens=2)
    # Run files are strict JSON too: a clock that failed is written as unknown.
    assert strict_json((tmp_path / "ref" / "records.jsonl").read_text().splitlines()[0])["timing"] == {
        "ttft_s": None, "total_s": None}
    r = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    strict_json((tmp_path / "out" / "report.json").read_text())
    assert_reports_safe(tmp_path / "out", console_text(r))
    # A -inf logprob in a stored run is refused by the audit before any report is written.
    bad = [rec("p1", [9, 8], tops=[step((9, -0.1), (7, -inf)), step((8, -0.1), (3, -2.0))])]
    write_run(tmp_path / "bad", bad, max_tokens=2)
    r = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "bad")])
    assert r.exit_code == 2 and "finite-logprobs" in r.output


def _result(name: str, pid: str, error: str, problem: str):
    def run(records) -> Run:
        m = Manifest(engine=EngineInfo(kind="hand", model=name), prompt_set={"sha256": "0" * 64},
                     sampling=Sampling(2, 2), created=now_iso(), status="complete")
        return Run("run", m, {r.id: r for r in records})

    ref = run([rec(pid, [5, 6]), rec("b", [5, 6])])
    cand = run([rec(pid, [], error=error), rec("b", [5, 7])])
    spec = GateSpec(name, PromptSetRef.stored({"name": name, "sha256": "0" * 64}, [pid, "b"]), Sampling(2, 2),
                    policy="strict", band=0.5)
    return judge(spec, ref, cand, problems=[problem])


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
