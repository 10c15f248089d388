"""A re-scorer proves it is the recorded reference before it vouches, and a report's redacted
secret is exported or refused (issue 50, items 1 and 4).

Was: a [rescorer] naming the candidate's own engine under another spelling (`python -u`, an
extra flag) passed the identity check by name and vouched for the candidate's junk (exit 0);
`strict-gate diagnose` and `gate --resume` without the reference's secret exported ran the
engine without its key (the "<redacted>" entry silently left out), which re-scored as a fallback
model, and a failing gate was rewritten as PASS (exit 0); diagnose and localize started their
engines with their logs in unnamed temp files, left behind.

Real parts only: the engines are tests/engines/cascade_engine.py (a toy model; `--needs-key`
makes it a server that answers without its key by a fallback model) and config_engine.py (it
dumps, for localize), real child processes speaking the command protocol; every command is a real
`strict-gate` process run from its working directory with relative paths.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_gate

ROOT = Path(__file__).resolve().parents[1]
CASCADE = ROOT / "tests" / "engines" / "cascade_engine.py"
CONFIG_ENGINE = ROOT / "tests" / "engines" / "config_engine.py"
ENV = {k: v for k, v in os.environ.items() if k != "MY_API_KEY"} | {"PYTHONPATH": str(ROOT), "COLUMNS": "200"}
SECRET = "sg-" + "k3y" * 6
HOSTILE = ["--flip", "2", "--garbage"]  # a near-tie at 2, then tokens 4.9 nats below the argmax


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A real `strict-gate` process in the test's working directory (monkeypatch.chdir)."""
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], env=env or ENV, capture_output=True,
                          text=True, timeout=180)


def flat(p: subprocess.CompletedProcess) -> str:
    return " ".join((p.stdout + p.stderr).split())


def cascade(*args: str) -> dict:
    return {"kind": "command", "command": ["python", "cascade_engine.py", *args]}


def setup(tmp_path: Path, monkeypatch, *, reference: dict, candidate: dict, **top) -> None:
    """Two prompts of the cascade tests, a gate.toml with relative paths in the working directory."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(CASCADE, "cascade_engine.py")
    Path("prompts.jsonl").write_text("".join(json.dumps({"id": i, "token_ids": t}) + "\n"
                                             for i, t in {"p0": [1, 2, 3], "p1": [4, 5, 6, 7]}.items()))
    write_gate(Path("."), name="proof", prompts="prompts.jsonl", max_tokens=8, top_logprobs=5, policy="near-tie",
               band=0.5, output_dir="reports", reference=reference, candidate=candidate, **top)


def only_report() -> Path:
    (d,) = [p for p in Path("reports").iterdir() if p.is_dir()]
    return d


def stored_reference(tmp_path: Path, monkeypatch) -> None:
    """A live gate's reference run kept as ref-run/, the reports cleared."""
    setup(tmp_path, monkeypatch, reference=cascade("reference"), candidate=cascade("candidate", "--flip", "2"))
    first = cli("gate", "gate.toml")
    assert first.returncode == 0, flat(first)
    shutil.copytree(only_report() / "reference", "ref-run")
    shutil.rmtree("reports")


@pytest.mark.parametrize("spelling", [["python", "-u", "cascade_engine.py", "candidate", *HOSTILE],
                                      ["python", "cascade_engine.py", "candidate", *HOSTILE, "--eos-at", "99"]],
                         ids=["python-u", "extra-flag"])
def test_a_rescorer_that_is_the_candidate_under_another_spelling_is_refused_by_its_numbers(tmp_path, monkeypatch,
                                                                                          spelling):
    """A stored reference; the [rescorer] is the candidate's own engine under another command line,
    so the identity check by name lets it through. It scores the reference's own tokens of p0 as
    its own junk from position 2: exit 3, naming the prompt and the position."""
    stored_reference(tmp_path, monkeypatch)
    setup(tmp_path, monkeypatch, reference={"kind": "recorded", "path": "ref-run"},
          candidate=cascade("candidate", *HOSTILE), rescorer={"kind": "command", "command": spelling})
    p = cli("gate", "gate.toml")
    assert p.returncode == 3, flat(p)  # before: exit 0, "5/5 later position(s) judged, 0 later flip(s)"
    said = flat(p)
    assert "is not the recorded reference" in said and "prompt 'p0', at position 2" in said, said
    assert "Traceback" not in said
    assert not (only_report() / "report.json").exists()  # no verdict was written on its word


def test_the_references_own_engine_as_rescorer_proves_itself_and_judges(tmp_path, monkeypatch):
    """The same stored reference with the reference's engine (another spelling of it) as [rescorer]:
    it agrees with the recording, and judges the junk a later divergence (exit 1)."""
    stored_reference(tmp_path, monkeypatch)
    setup(tmp_path, monkeypatch, reference={"kind": "recorded", "path": "ref-run"},
          candidate=cascade("candidate", *HOSTILE),
          rescorer={"kind": "command", "command": ["python", "-u", "cascade_engine.py", "reference"]})
    p = cli("gate", "gate.toml")
    assert p.returncode == 1, flat(p)
    report = json.loads((only_report() / "report.json").read_text())
    assert next(r for r in report["prompts"] if r["id"] == "p0")["reason"].startswith(
        "divergent after a near-tie: later position 3")


def keyed_gate(tmp_path: Path, monkeypatch) -> Path:
    """A reference that needs MY_API_KEY (its [reference.env]) and the hostile candidate: exit 1."""
    setup(tmp_path, monkeypatch, reference=cascade("reference", "--needs-key", "MY_API_KEY")
          | {"env": {"MY_API_KEY": SECRET}}, candidate=cascade("candidate", *HOSTILE))
    gate = cli("gate", "gate.toml")
    assert gate.returncode == 1, flat(gate)
    d = only_report()
    assert '"<redacted>"' in (d / "gate.toml").read_text()
    return d


def test_diagnose_without_the_references_secret_is_exit_2(tmp_path, monkeypatch):
    """The report's gate.toml reads MY_API_KEY = "<redacted>" and the variable is not exported:
    exit 2 naming gate.toml and the entry's line, the report left as it was."""
    d = keyed_gate(tmp_path, monkeypatch)
    before = (d / "report.json").read_text()
    p = cli("diagnose", str(d))
    assert p.returncode == 2, flat(p)  # before: exit 0, the failing gate rewritten as PASS
    line = next(i for i, s in enumerate((d / "gate.toml").read_text().splitlines(), 1) if s.startswith("MY_API_KEY"))
    assert f"gate.toml:{line}:" in flat(p) and "MY_API_KEY" in flat(p) and "export it" in flat(p), flat(p)
    assert (d / "report.json").read_text() == before


def test_diagnose_with_the_secret_exported_empty_is_exit_3_naming_prompt_and_position(tmp_path, monkeypatch):
    """MY_API_KEY exported but empty: the reference restarts and answers by its fallback model. It
    cannot prove itself on the reference's own tokens: exit 3, the report left as it was; with the
    secret exported it proves itself and the gate's verdict stands (exit 1)."""
    d = keyed_gate(tmp_path, monkeypatch)
    before = (d / "report.json").read_text()
    p = cli("diagnose", str(d), env=ENV | {"MY_API_KEY": ""})
    assert p.returncode == 3, flat(p)  # before: exit 0, PASS
    assert "is not the recorded reference" in flat(p) and "prompt 'p0', at position" in flat(p), flat(p)
    assert (d / "report.json").read_text() == before
    ok = cli("diagnose", str(d), env=ENV | {"MY_API_KEY": SECRET})
    assert ok.returncode == 1, flat(ok)
    assert SECRET not in flat(ok)


@pytest.mark.parametrize("key, code", [(None, 2), ("", 3)], ids=["unset", "empty"])
def test_a_resume_that_restarts_the_reference_needs_its_secret_and_its_proof(tmp_path, monkeypatch, key, code):
    """A gate whose report.json never got written (both arms done): the resume restarts the
    reference to re-score. Unset secret: exit 2; exported empty: it answers by its fallback model
    and cannot prove itself, exit 3. Before: exit 0 both ways, the keyless engine vouched."""
    d = keyed_gate(tmp_path, monkeypatch)
    (d / "report.json").unlink()
    p = cli("gate", "--resume", str(d), env=ENV | ({} if key is None else {"MY_API_KEY": key}))
    assert p.returncode == code, flat(p)
    assert ("export it" if key is None else "is not the recorded reference") in flat(p), flat(p)
    assert not (d / "report.json").exists()


def config_gate(tmp_path: Path, monkeypatch, *flags: str) -> Path:
    """config_engine.py arms (they dump, for localize); the candidate needs MY_API_KEY and diverges
    on p2 (exit 1), or with `flags` errs on p5."""
    monkeypatch.chdir(tmp_path)
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n"
                                       for i in range(6)))
    engine = ["python", str(CONFIG_ENGINE)]
    write_gate(Path("."), name="secret", prompts="p.jsonl", max_tokens=3, top_logprobs=2, policy="strict",
               output_dir="reports", reference={"kind": "command", "command": engine},
               candidate={"kind": "command", "command": [*engine, "--places", "stderr", *flags],
                          "env": {"MY_API_KEY": SECRET}})
    cli("gate", "gate.toml")
    return only_report()


def test_a_resume_that_continues_an_arm_without_its_secret_is_exit_2(tmp_path, monkeypatch):
    """The candidate erred on p5 (exit 3); resuming it without MY_API_KEY would run the rest of the
    arm under another configuration (its hello does not show its env, so nothing else notices).
    Before: it ran, and wrote env = {} into the manifest."""
    d = config_gate(tmp_path, monkeypatch, "--error-id", "p5")
    manifest = (d / "candidate" / "manifest.json").read_text()
    p = cli("gate", "--resume", str(d))
    assert p.returncode == 2, flat(p)
    assert "MY_API_KEY" in flat(p) and "gate.toml:" in flat(p), flat(p)
    assert (d / "candidate" / "manifest.json").read_text() == manifest
    assert json.loads(manifest)["engine"]["env"] == {"MY_API_KEY": "<redacted>"}


def test_localize_without_the_secret_is_exit_2(tmp_path, monkeypatch):
    """`strict-gate localize` restarts the candidate: without its secret exported, exit 2."""
    d = config_gate(tmp_path, monkeypatch, "--diverge", "p2")
    before = (d / "report.json").read_text()
    p = cli("localize", str(d))
    assert p.returncode == 2, flat(p)  # before: it localised an engine run without its key
    assert "MY_API_KEY" in flat(p) and "gate.toml:" in flat(p), flat(p)
    assert (d / "report.json").read_text() == before


def test_diagnose_and_localize_log_into_the_report_directory_and_leave_no_temp_file(tmp_path, monkeypatch):
    """Each engine they start logs beside its run (its engine.log, a second start header); nothing
    is left in the temp directory. Before: strict-gate-command-*.log files in $TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    d = config_gate(tmp_path, monkeypatch, "--diverge", "p2")
    env = ENV | {"MY_API_KEY": SECRET, "TMPDIR": str(tmp)}
    starts = {role: (d / role / "engine.log").read_text().count("--- strict-gate: starting") for role in
              ("reference", "candidate")}
    for args in (("diagnose", str(d)), ("localize", str(d))):
        p = cli(*args, env=env)
        assert p.returncode in (0, 1), (args, flat(p))
        assert sorted(str(f.relative_to(tmp)) for f in tmp.rglob("*")) == [], args
    for role in ("reference", "candidate"):
        assert (d / role / "engine.log").read_text().count("--- strict-gate: starting") > starts[role], role


def test_check_engine_names_its_log_and_leaves_nothing_else(tmp_path, monkeypatch):
    """check-engine has no report directory: its one log is named on the console, and it is the only
    thing left in the temp directory (a guard: this held before)."""
    monkeypatch.chdir(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    Path("e.toml").write_text(f'kind = "command"\ncommand = ["python", "{CONFIG_ENGINE}"]\ntimeout_s = 10\n')
    p = cli("check-engine", "e.toml", env=ENV | {"TMPDIR": str(tmp)})
    assert p.returncode == 0, flat(p)
    left = [f for f in tmp.rglob("*") if f.is_file()]
    assert len(left) == 1 and f"engine log: {left[0]}" in flat(p), (left, flat(p))
