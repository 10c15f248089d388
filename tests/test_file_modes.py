"""Reports, junit.xml, manifests and run directories get the user's umask, like records.jsonl:
atomic temp files must not leave them 0600 (nor a staged run directory 0700)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from helpers import toml_text, write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

FAKE = Path(__file__).resolve().parent / "engines" / "fake_engine.py"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_gate_and_run_outputs_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 20 + i]}) + "\n" for i in range(2)))
    engine_arm = {"kind": "command", "command": [sys.executable, FAKE]}
    gate = write_gate(tmp_path, name="modes", prompts="p.jsonl", max_tokens=2, top_logprobs=2, output_dir=tmp_path / "r",
                      reference=engine_arm, candidate=engine_arm)
    result = CliRunner().invoke(app, ["gate", str(gate)])
    assert result.exit_code == 0, result.output
    (report_dir,) = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    files = [report_dir / n for n in ("report.md", "report.json", "report.html", "junit.xml", "gate.toml")]
    files += [report_dir / arm / n for arm in ("reference", "candidate") for n in ("manifest.json", "records.jsonl")]
    want = 0o666 & ~mask
    assert {str(f.relative_to(report_dir)): oct(_mode(f)) for f in files} == {
        str(f.relative_to(report_dir)): oct(want) for f in files
    }
    engine = tmp_path / "engine.toml"
    engine.write_text(toml_text(engine_arm))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(engine), "--prompts", str(prompts), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _mode(out) == 0o777 & ~mask
    assert _mode(out / "manifest.json") == want and _mode(out / "records.jsonl") == want
