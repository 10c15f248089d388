"""history.jsonl, the trend in the reports, baseline staleness and the workflow file (no model)."""

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import rec, write_gate, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.core.model_files import model_digest
from strict_gate.judge.history import HISTORY_FILE, append_history, git_commit, read_history
from strict_gate.judge.staleness import baseline_staleness
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.records import EngineInfo

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def gate_setup(tmp_path: Path, cand_tokens=(8, 9, 10)) -> Path:
    p = tmp_path / "set.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, 3]}) + "\n" for i in range(2)))
    sha = load_prompts(p).sha256
    write_run(tmp_path / "ref", [rec("p0", [5, 6, 7]), rec("p1", [8, 9, 10])], sha=sha, max_tokens=3, model="tiny")
    write_run(tmp_path / "cand", [rec("p0", [5, 6, 7]), rec("p1", cand_tokens)], sha=sha, max_tokens=3, model="tiny")
    return write_gate(tmp_path, name="hist", prompts="set.jsonl", max_tokens=3, policy="strict", output_dir=tmp_path / "out",
                      reference={"kind": "recorded", "path": "ref", "model": "tiny"},
                      candidate={"kind": "recorded", "path": "cand"})


def test_each_gate_appends_one_line_and_reports_show_the_trend(tmp_path):
    g = gate_setup(tmp_path)
    assert runner.invoke(app, ["gate", str(g)]).exit_code == 0
    gate_setup(tmp_path, cand_tokens=(8, 11, 10))
    r = runner.invoke(app, ["gate", str(g), "--summary", str(tmp_path / "s.md")])
    assert r.exit_code == 1, r.output
    entries = read_history(tmp_path / "out")
    assert [e["verdict"] for e in entries] == ["pass", "fail"]
    e = entries[-1]
    assert e["prompts"] == {"exact": 1, "total": 2} and e["positions"] == {"matched": 5, "total": 6}
    assert e["counts"]["divergent"] == 1 and e["gate"] == "hist" and "drift" not in e
    assert e["reference"] == {"kind": "hand", "model": "tiny", "versions": {}, "baseline": str(tmp_path / "ref")}
    assert (tmp_path / "out" / e["report_dir"] / "report.json").is_file()
    report = json.loads((tmp_path / "out" / e["report_dir"] / "report.json").read_text())
    assert report["history"] == list(entries)
    md = (tmp_path / "out" / e["report_dir"] / "report.md").read_text()
    assert "## Trend (last 2 nights)" in md and "| fail | 1/2 | 5/6 | 0 | 1 |" in md
    summary = (tmp_path / "s.md").read_text()
    assert summary.startswith("# FAIL: hist") and "## Trend" in summary and "## Engines" not in summary


def test_torn_last_line_and_other_gates_are_skipped(tmp_path):
    for i in range(20):
        append_history(tmp_path, {"gate": "a" if i % 2 else "b", "n": i})
    with open(tmp_path / HISTORY_FILE, "ab") as f:
        f.write(b'{"gate": "a", "n": 9')  # a writer killed mid-line
    assert [e["n"] for e in read_history(tmp_path, 3, gate="a")] == [15, 17, 19]
    assert len(read_history(tmp_path, 100)) == 20 and read_history(tmp_path / "none") == ()
    append_history(tmp_path, {"gate": "a", "n": 21})  # the next night starts a new line
    assert [e["n"] for e in read_history(tmp_path, 2, gate="a")] == [19, 21]


def test_git_commit_fails_silently(tmp_path):
    assert git_commit(tmp_path) is None and git_commit(None) is None
    commit = git_commit(ROOT)
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit)


def test_summary_goes_to_github_step_summary(tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    assert runner.invoke(app, ["gate", str(gate_setup(tmp_path))]).exit_code == 0
    text = step.read_text()
    assert text.startswith("earlier step\n# PASS: hist")


def test_baseline_staleness(tmp_path, monkeypatch):
    model = tmp_path / "m"
    model.mkdir()
    (model / "w.bin").write_bytes(b"\0" * 100)
    digest = model_digest(model)
    assert digest.startswith("sha256-files:") and model_digest(tmp_path / "nothing") is None
    info = EngineInfo(kind="vllm", model=str(model),
                      options={"replayed_from": "baselines/x", "resolved_model": str(model), "model_digest": digest},
                      versions={"vllm": "0.32.0"})
    monkeypatch.setattr("strict_gate.judge.staleness.installed_vllm", lambda: "0.32.0")
    assert baseline_staleness(info) == ()
    assert baseline_staleness(replace(info, options={})) == ()  # a live reference: nothing to say
    (model / "w.bin").write_bytes(b"\1" * 100)
    monkeypatch.setattr("strict_gate.judge.staleness.installed_vllm", lambda: "0.33.1")
    (note,) = baseline_staleness(info)
    assert "baseline baselines/x may be stale" in note and "vLLM 0.32.0 and vLLM 0.33.1 is installed" in note
    assert f"the model files at {model} differ" in note and "--out baselines/x --force" in note


def test_committed_baseline_digest_matches_bundled_model():
    """The bundled model hashes the same from any checkout (names relative to the model dir)."""
    d = model_digest(ROOT / "strict_gate" / "models" / "tiny-llama")
    assert d == model_digest(ROOT / "strict_gate" / "models" / "tiny-llama")


def test_workflow_calls_the_script():
    """The workflow cannot run here: check it is scheduled, dispatchable, restores and keeps the
    output directory the script uses, and runs scripts/nightly.sh (tests/test_nightly.py runs it)."""
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly-gate.yml").read_text())
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "schedule" in triggers and "workflow_dispatch" in triggers
    (job,) = wf["jobs"].values()
    steps = job["steps"]
    assert any("scripts/install.sh" in s.get("run", "") for s in steps)
    (nightly,) = [s for s in steps if "scripts/nightly.sh" in s.get("run", "")]
    output = nightly["env"]["NIGHTLY_OUTPUT"]
    uses = {s.get("uses", "").split("@")[0]: s for s in steps if s.get("uses")}
    for action in ("actions/cache/restore", "actions/cache/save", "actions/upload-artifact"):
        assert uses[action]["with"]["path"] == output, action
    assert uses["actions/cache/save"]["if"] == "always()" and uses["actions/upload-artifact"]["if"] == "always()"
    order = [steps.index(uses["actions/cache/restore"]), steps.index(nightly), steps.index(uses["actions/cache/save"])]
    assert order == sorted(order)
    assert os.access(ROOT / "scripts" / "nightly.sh", os.X_OK)


def test_gate_notes_a_stale_baseline(tmp_path, monkeypatch):
    """A recorded reference captured with another vLLM than the installed one: a note, not a failure."""
    g = gate_setup(tmp_path)
    manifest = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    manifest["engine"]["versions"] = {"vllm": "0.1.0"}
    (tmp_path / "ref" / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr("strict_gate.judge.staleness.installed_vllm", lambda: "0.32.0")
    assert runner.invoke(app, ["gate", str(g)]).exit_code == 0  # a note, not a failure
    (d,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    (note,) = [n for n in json.loads((d / "report.json").read_text())["notes"] if "may be stale" in n]
    assert "captured with vLLM 0.1.0 and vLLM 0.32.0 is installed here" in note and "--force" in note
    assert "may be stale" in (d / "report.md").read_text()  # report.html and the console do not show result.notes yet


def test_nightly_offline_keep_and_bad_previous(tmp_path):
    """strict-gate nightly on stored runs: the second night diffs against the first through the
    history, --keep bounds the report dirs, and a --previous that is not a report is exit 2
    before the gate runs."""
    g = gate_setup(tmp_path)
    out = tmp_path / "out"
    assert runner.invoke(app, ["nightly", str(g), "--keep", "1"]).exit_code == 0
    gate_setup(tmp_path, cand_tokens=(8, 11, 10))
    r = runner.invoke(app, ["nightly", str(g), "--keep", "1", "--summary", str(tmp_path / "s.md")])
    assert r.exit_code == 1, r.output
    (d,) = [p for p in out.iterdir() if p.is_dir()]  # last night's directory was pruned
    diff = json.loads((d / "diff.json").read_text())
    assert diff["stopped_matching"] == ["p1"] and diff["regression"] is True
    assert len(read_history(out)) == 2 and (d / "summary.md").read_text() == (tmp_path / "s.md").read_text()
    r = runner.invoke(app, ["nightly", str(g), "--previous", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "nowhere" in r.output
    assert len([p for p in out.iterdir() if p.is_dir()]) == 1 and len(read_history(out)) == 2
