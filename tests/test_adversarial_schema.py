"""report.json declared once (judge/schema.py): the writer is checked against the shapes the
readers decode, so a writer and a reader cannot drift apart, and a hostile report.json is exit 2
naming the field. Real gates on command engines, run from a working directory with relative
paths, as a user runs them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from helpers import cascade_gate

from strict_gate.core.sections import UndeclaredField
from strict_gate.judge import schema
from strict_gate.judge.schema import ReportDoc, check_written
from strict_gate.judge.stored import load_report

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory) -> Path:
    """A failing gate (a flip, then tokens the reference ranks far below): diagnoses, later
    positions, divergences, every part of a prompt's row. Its report directory, relative to cwd."""
    where = tmp_path_factory.mktemp("schema")
    cascade_gate(where, "schema")
    out = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", "gate.toml"], cwd=where,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    (report,) = [p for p in (where / "reports").iterdir() if p.is_dir()]
    return report


def test_every_key_a_real_gate_writes_is_declared_and_reads_back_equal(gate_dir):
    body = json.loads((gate_dir / "report.json").read_text())
    doc = check_written(body)  # the writer's own check, on the file it wrote
    assert body["prompts"][0]["diagnosis"]["later"]["divergent_positions"], "a row with every part"
    assert load_report(gate_dir) == doc  # the reader decodes the very shape the writer was checked against


def test_an_undeclared_key_in_any_part_of_a_written_report_is_refused(gate_dir):
    body = json.loads((gate_dir / "report.json").read_text())
    for path in (("surprise",), ("prompts", 0, "surprise"), ("prompts", 0, "diagnosis", "later", "surprise"),
                 ("prompts", 0, "first_divergence", "surprise"), ("summary", "flips", "surprise")):
        bad = json.loads(json.dumps(body))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = 1
        with pytest.raises(UndeclaredField, match="surprise: written but not declared"):
            check_written(bad)


def test_a_value_of_another_type_or_a_section_no_feature_declares_is_refused(gate_dir):
    body = json.loads((gate_dir / "report.json").read_text())
    wrong = json.loads(json.dumps(body))
    wrong["prompts"][0]["matched_positions"] = "two"
    with pytest.raises(UndeclaredField, match="prompts"):
        check_written(wrong)
    alien = json.loads(json.dumps(body))
    alien["features"] = {"telemetry": {"verdict": "pass", "exit_code": 0, "section": {}}}
    with pytest.raises(UndeclaredField, match="no registered feature declares"):
        check_written(alien)


def test_the_writer_refuses_before_any_file_is_written(gate_dir, tmp_path, monkeypatch):
    """A writer bug (a key no reader knows) stops write_reports: no report.json appears, so no
    half-declared report reads as complete."""
    import strict_gate.report as report
    from strict_gate.offline.compare import compare_run_dirs

    result = compare_run_dirs(gate_dir / "reference", gate_dir / "candidate", policy="strict", band=0.5)
    real = report.to_json
    monkeypatch.setattr(report, "to_json", lambda r: real(r) | {"verdict_v2": "pass"})
    with pytest.raises(UndeclaredField, match="verdict_v2"):
        report.write_reports(result, tmp_path / "out")
    assert not (tmp_path / "out" / "report.json").exists()


def test_a_feature_section_with_a_key_its_shape_does_not_declare_is_refused():
    from strict_gate.drift.measure import DriftReport, Stats

    class Leaky(DriftReport):
        def to_json(self) -> dict:
            return super().to_json() | {"debug": True}

    none = Stats(None, None, None)
    drift = Leaky(band=0.5, k=5, positions=0, same_top1=0, abs_dlogprob=none, kl=none, min_reference_margin=None,
                  positions_within_band=0, prompts={})
    body = {"schema": "strict-gate/report@3", "prompts": [],
            "features": {"drift": {"verdict": "informational", "exit_code": 0, "section": drift.to_json()}}}
    with pytest.raises(UndeclaredField, match=r"features\.drift\.section\.debug"):
        check_written(body)
    body["features"]["drift"]["section"] = DriftReport.to_json(drift)
    check_written(body)  # the same section without the leak is declared


@pytest.mark.parametrize(("where", "value", "field"), [
    (("engines", "reference", "options", "replayed_from"), 5, "engines.reference.options"),
    (("prompts", 0, "diagnosis", "verdict"), None, "prompts[0].diagnosis.verdict"),
    (("prompts", 0, "diagnosis", "later", "outcome"), "fine", "prompts[0].diagnosis.later.outcome"),
    (("prompts", 0, "first_divergence", "reference_top"), [[1, "x"]], "prompts[0].first_divergence.reference_top"),
])
def test_a_hostile_report_is_exit_2_naming_the_field_on_every_reading_command(gate_dir, tmp_path, monkeypatch,
                                                                               where, value, field):
    """show, diff and localize read through the declared shapes: a field of the wrong type is bad
    input naming it (exit 2), never a traceback and never a silent default."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(gate_dir, "hostile")
    body = json.loads(Path("hostile/report.json").read_text())
    node = body
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    Path("hostile/report.json").write_text(json.dumps(body))
    for args in (("show", "hostile"), ("diff", str(gate_dir), "hostile"), ("localize", "hostile")):
        out = cli(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert field in out.stdout + out.stderr and "Traceback" not in out.stderr, (args, out.stderr)


def test_no_hand_kept_mirror_of_report_json_is_left():
    """One declaration: no Stored* reader classes, no hand-written from_json on the judge's
    results (judge/restore.py builds them from the declared shapes), no Struct declared in
    stored.py beyond its schema probe."""
    tree = {p: ast.parse(p.read_text()) for p in (ROOT / "strict_gate").rglob("*.py")}
    classes = [(p.name, n.name) for p, t in tree.items() for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
    assert [c for c in classes if c[1].startswith("Stored")] == []
    for name in ("diagnose.py", "cascade.py", "localization.py"):
        t = tree[ROOT / "strict_gate" / "judge" / name]
        assert not [n.name for n in ast.walk(t) if isinstance(n, ast.FunctionDef) and n.name == "from_json"], name
    stored = tree[ROOT / "strict_gate" / "judge" / "stored.py"]
    assert {n.name for n in ast.walk(stored) if isinstance(n, ast.ClassDef)} <= {"_Schema", "_RawFeatures"}
    declared = [n for n in dir(schema) if isinstance(getattr(schema, n), type)
                and issubclass(getattr(schema, n), msgspec.Struct) and getattr(schema, n).__module__ == schema.__name__]
    assert "ReportDoc" in declared and "PromptDoc" in declared and len(declared) >= 20
    assert ReportDoc.__struct_fields__[:2] == ("schema", "prompts")
