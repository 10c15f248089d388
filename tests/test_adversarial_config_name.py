"""A config without `name` is named after its file; the report keeps a copy as gate.toml, and every
command that reads that copy back (`gate --resume`, `diagnose`, `localize`, `invariance --resume`)
must name the gate as it ran: before, the copy's stem ("gate") made the name "change", so the
resume of any such gate was refused (exit 2) and a diagnose renamed its report.

Run from a working directory with relative paths, on real command engines (tests/engines/)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENGINES = Path(__file__).resolve().parent / "engines"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"COLUMNS": "200"})


def _unnamed_gate(tmp_path: Path, monkeypatch) -> Path:
    """my-gate.toml without `name`, relative paths; the gate run; its report directory (relative)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINES / "variant_engine.py", "engine.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7]}) + "\n"
                                       for i in range(4)), encoding="utf-8")
    arm = '[{role}]\nkind = "command"\ncommand = ["python", "engine.py", "--score"]\n'
    Path("my-gate.toml").write_text('prompts = "p.jsonl"\nmax_tokens = 4\ntop_logprobs = 2\noutput_dir = "out"\n'
                                    + arm.format(role="reference") + arm.format(role="candidate"), encoding="utf-8")
    p = _cli("gate", "my-gate.toml")
    assert p.returncode == 0, p.stdout + p.stderr
    (d,) = [x for x in Path("out").iterdir() if x.is_dir()]
    assert d.name.startswith("my-gate-") and not d.is_absolute()
    return d


def test_the_resume_of_a_gate_whose_config_has_no_name_is_not_refused(tmp_path, monkeypatch):
    d = _unnamed_gate(tmp_path, monkeypatch)
    p = _cli("gate", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr  # before: exit 2, "name changed since the gate started"
    assert "name changed" not in p.stdout + p.stderr
    (d / "report.json").unlink()  # an interrupted write: the resume judges again and writes the reports
    p = _cli("gate", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads((d / "report.json").read_text(encoding="utf-8"))["name"] == "my-gate"


def test_diagnose_keeps_the_gates_name(tmp_path, monkeypatch):
    d = _unnamed_gate(tmp_path, monkeypatch)
    p = _cli("diagnose", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((d / "report.json").read_text(encoding="utf-8"))
    assert report["name"] == "my-gate"  # before: "gate", the copy's stem
    assert (d / "report.md").read_text(encoding="utf-8").startswith("# PASS: my-gate ")
