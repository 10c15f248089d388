"""The acceptance runner itself (benchmarks/acceptance.py, benchmarks/acceptance_table.py): its table is
read strictly, a phase that failed silently is caught, a wrong exit code is caught, and a real SIGKILL
leaves what a killed gate leaves. Seconds: the steps here run a stand-in `strict-gate` (a shell
script in a temporary copy), because the unit under test is the runner, not the gate; the real gates
run in `bash scripts/acceptance.sh` (.ci/run)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("acceptance", ROOT / "benchmarks" / "acceptance.py")
acceptance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(acceptance)
import acceptance_table as at  # benchmarks/ is put on the path above

PATTERNS = at.load_table(ROOT / "benchmarks" / "acceptance.toml").scan.patterns
ROW = '''
[scan]
patterns = ["not localised", "is missing"]

[[step]]
id = "g"
tier = "fast"
command = "strict-gate gate gates/g.toml"
exit = 1
'''


def _table(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "acceptance.toml"
    path.write_text(ROW + extra, encoding="utf-8")
    return path


def _step(**kw) -> at.Step:
    return at.Step(**{"id": "g", "tier": "fast", "command": "strict-gate gate gates/g.toml", "exit": 1, **kw})


def _report(tmp_path: Path, notes: list[str], exact: int = 115, localization: dict | None = None) -> Path:
    d = tmp_path / "reports" / "g-1"
    d.mkdir(parents=True)
    prompts = [{"id": "p0", "status": "near_tie", "text": "the engine failed is not localised here", "localization":
                localization}]
    (d / "report.json").write_text(json.dumps({
        "notes": notes, "problems": [], "prompts": prompts,
        "summary": {"prompts_exact": exact, "prompts_total": 128, "positions_matched": 1922,
                    "counts": {"near_tie": 13, "divergent": 0}}}), encoding="utf-8")
    (d / "report.md").write_text("# FAIL: g\n", encoding="utf-8")
    return d


def test_the_shipped_table_reads_and_covers_every_shipped_gate():
    table = at.load_table(ROOT / "benchmarks" / "acceptance.toml")
    gates = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "gates").glob("*.toml"))
    assert at.uncovered_gates(gates, table.step) == []
    assert {s.tier for s in table.step} == {"fast", "full", "capture"}
    fast = at.select(table, "fast")
    assert fast and all(s.tier == "fast" for s in fast)
    full = at.select(table, "full")
    assert {s.id for s in fast} < {s.id for s in full} and all(s.tier != "capture" for s in full)
    assert len(at.select(table, "all")) == len(table.step)


def test_a_gate_without_a_row_is_named():
    assert at.uncovered_gates(["gates/g.toml", "gates/new.toml"], (_step(),)) == ["gates/new.toml"]
    # a gate whose name is a prefix of another's is not covered by the other's row
    assert at.uncovered_gates(["gates/g.toml"], (_step(command="strict-gate gate gates/g.toml.bak"),)) == ["gates/g.toml"]


@pytest.mark.parametrize("extra, message", [
    ('figures = { prompts_exact = [100, 108] }\n', "figures_why"),
    ('allow = ["not localised"]\n', "allow_why"),
    ('colour = "red"\n', "colour"),
    ('figures = { prompts_exact = [108, 100] }\nfigures_why = "x"\n', "is empty"),
    ('kill_at_records = 5\n', "exit -9"),
    ('allow = ["(unclosed"]\nallow_why = "x"\n', "bad regex"),
])
def test_a_malformed_row_is_refused_naming_the_file(tmp_path, extra, message):
    path = _table(tmp_path, extra)
    with pytest.raises(at.TableError, match=message) as e:
        at.load_table(path)
    assert str(path) in str(e.value)


def test_a_report_of_a_later_step_or_a_repeated_id_is_refused(tmp_path):
    with pytest.raises(at.TableError, match="names no earlier step"):
        at.load_table(_table(tmp_path, 'report = "{report:later}"\n'))
    with pytest.raises(at.TableError, match="used twice"):
        at.load_table(_table(tmp_path, ROW.split("[[step]]")[1].join(["\n[[step]]", ""])))


def test_only_brings_the_steps_a_step_follows(tmp_path):
    path = _table(tmp_path, '\n[[step]]\nid = "loc"\ntier = "full"\ncommand = "strict-gate localize {report:g}"\n'
                            'report = "{report:g}"\nexit = 0\n')
    table = at.load_table(path)
    assert [s.id for s in at.select(table, "fast", ("loc",))] == ["g", "loc"]
    assert [s.id for s in at.select(table, "fast")] == ["g"]
    with pytest.raises(at.TableError, match="no step named nope"):
        at.select(table, "fast", ("nope",))


def test_a_planted_silent_failure_is_caught_though_the_exit_code_is_right(tmp_path):
    note = ("localisation of prompt 'p0' failed: hf engine: dump reply breaks the rule: reports/g-1/localize/"
            "reports/g-1/localize/activations.safetensors is missing")
    d = _report(tmp_path, [note], localization={"error": note})
    unmet = at.check(_step(), at.Outcome(1, "", d, 1.0), PATTERNS)
    assert any("report.json: notes[0]" in u and "is missing" in u for u in unmet)
    assert any("prompts[0].localization.error" in u for u in unmet)
    assert not any("prompts[0].text" in u for u in unmet)  # an engine's text is never read as a note
    # the same report, the note allowed by the row (with its reason): nothing unmet
    allowed = _step(allow=["localisation of prompt", "dump reply"], allow_why="a test")
    assert at.check(allowed, at.Outcome(1, "", d, 1.0), PATTERNS) == []


def test_a_clean_report_meets_its_row_and_a_wrong_exit_code_does_not(tmp_path):
    d = _report(tmp_path, ["auto: the reference has no repeated samples"])
    row = _step(figures={"prompts_exact": (112.0, 118.0), "near_tie": 13.0}, figures_why="bf16")
    assert at.check(row, at.Outcome(1, "", d, 1.0), PATTERNS) == []
    assert at.check(row, at.Outcome(0, "", d, 1.0), PATTERNS) == ["exit 0, expected 1"]


def test_figures_outside_their_range_or_absent_are_unmet(tmp_path):
    d = _report(tmp_path, [], exact=100)
    row = _step(figures={"prompts_exact": (112.0, 118.0), "divergent": 0.0, "diff.json:regressions": 0.0},
                figures_why="bf16")
    unmet = at.check(row, at.Outcome(1, "", d, 1.0), PATTERNS)
    assert unmet == ["prompts_exact = 100, expected 112-118", "diff.json:regressions: not found in the report"]
    (d / "diff.json").write_text(json.dumps({"regressions": [{"rule": "new-failure"}]}), encoding="utf-8")
    assert at.check(row, at.Outcome(1, "", d, 1.0), PATTERNS)[-1] == "diff.json:regressions = 1, expected 0"


def test_a_traceback_in_the_output_and_a_step_not_run_are_never_a_pass(tmp_path):
    out = "Traceback (most recent call last):\n  File x\nStopIteration\n"
    assert at.check(_step(), at.Outcome(1, out, None, 1.0), PATTERNS)[0].startswith("failure note: output: Traceback")
    assert at.check(_step(), at.Outcome(None, "", None, 0.0, skipped="needs .venvs/x"), PATTERNS) == [
        "not run: needs .venvs/x"]


FAKE_CLI = '''#!/usr/bin/env bash
# a stand-in strict-gate: `gate` writes a run record by record, then its report; `localize DIR` reads DIR
set -e
case "$1" in
  gate) d=reports/g-$$; mkdir -p $d/candidate; echo '{}' > $d/gate-state.json
        for i in $(seq 1 40); do echo '{}' >> $d/candidate/records.jsonl.partial; sleep 0.05; done
        mv $d/candidate/records.jsonl.partial $d/candidate/records.jsonl
        echo '{"notes": [], "summary": {"prompts_exact": 40, "counts": {}}}' > $d/report.json; exit 1 ;;
  localize) test -f "$2/report.json" && test "${2#/}" = "$2" && echo "localised $2"; exit 0 ;;
esac
exit 2
'''


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    (copy / ".venv" / "bin").mkdir(parents=True)
    cli = copy / ".venv" / "bin" / "strict-gate"
    cli.write_text(FAKE_CLI, encoding="utf-8")
    cli.chmod(0o755)
    return copy


def test_a_real_sigkill_mid_run_and_a_follow_up_on_the_relative_report_path(tmp_path):
    runner = acceptance.Runner(_copy(tmp_path), PATTERNS)
    killed = _step(id="killed", exit=-9, kill_at_records=5, absent=("report.json",), files=("gate-state.json",))
    out = runner.run(killed)
    assert out.exit == -9 and out.report_dir is not None and not (out.report_dir / "report.json").exists()
    assert at.check(killed, out, PATTERNS) == []
    # the same command run to its end: the report is there, and a follow-up gets its path relative
    runner.run(_step(id="whole"))
    follow = _step(id="loc", command="strict-gate localize {report:whole}", exit=0, report="{report:whole}",
                   output=(r"localised reports/g-\d+$",))
    out = runner.run(follow)
    assert at.check(follow, out, PATTERNS) == [], out.output


def test_a_step_whose_engine_is_not_installed_is_not_run(tmp_path):
    runner = acceptance.Runner(_copy(tmp_path), PATTERNS)
    out = runner.run(_step(needs=(".venvs/llamacpp/bin/python",)))
    assert out.exit is None and "not installed" in out.skipped
    follow = runner.run(_step(id="loc", command="strict-gate localize {report:g}", report="{report:g}"))
    assert follow.skipped == "no report from step g"


def test_the_copy_is_the_commit_with_the_installed_trees_linked(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("committed\n", encoding="utf-8")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    (repo / "a.txt").write_text("not committed\n", encoding="utf-8")
    (repo / ".venv").mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    commit = acceptance.make_copy(repo, "HEAD", dest)
    assert len(commit) == 40
    assert (dest / "a.txt").read_text(encoding="utf-8") == "committed\n"
    assert (dest / ".venv").is_symlink() and (dest / ".venv").resolve() == (repo / ".venv").resolve()
    assert not (dest / "build").exists()


def test_every_row_runs_a_real_subcommand_on_files_the_commit_has():
    """A row is a command a user can type: its subcommand exists, and every gate or baseline it names
    is in the repository (a typo would only show as an exit 2 in the acceptance run itself)."""
    from strict_gate.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands} | {
        g.name for g in app.registered_groups}
    for step in at.load_table(ROOT / "benchmarks" / "acceptance.toml").step:
        words = step.command.split()
        assert words[1] in commands, step.id
        for word in words[2:]:
            if word.startswith(("gates/", "baselines/")):
                assert (ROOT / word).exists(), f"{step.id}: {word}"


def test_the_copy_imports_its_own_code_not_the_checkouts(tmp_path):
    """The venv is an editable install of some checkout; the copy's PYTHONPATH must win."""
    copy = tmp_path / "copy"
    (copy / "strict_gate").mkdir(parents=True)
    (copy / "strict_gate" / "__init__.py").write_text("", encoding="utf-8")
    (copy / ".venv").symlink_to(Path(sys.executable).parents[1], target_is_directory=True)
    assert acceptance.runner_imports(copy).startswith(str(copy))


def test_the_results_are_written_after_every_step_and_say_when_they_are_whole(tmp_path):
    copy, out = _copy(tmp_path), tmp_path / "out"
    out.mkdir()
    meta = {"tier": "fast", "commit": "0" * 40, "machine": "m", "command": "c", "selected": 2, "uncovered": []}
    steps = (_step(), _step(id="loc", command="strict-gate localize {report:g}", exit=0, report="{report:g}"))
    rows = acceptance.run_steps(acceptance.Runner(copy, PATTERNS), steps, PATTERNS, meta, out)
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [r["passed"] for r in rows] == [True, True] and doc["complete"] and doc["passed"] == 2
    assert "| loc | `strict-gate localize {report:g}` | 0 (0) |" in (out / "results.md").read_text(encoding="utf-8")
    acceptance.run_steps(acceptance.Runner(copy, PATTERNS), steps[:1], PATTERNS, meta, out)  # a run stopped after 1
    assert "partial: 1 of 2" in (out / "results.md").read_text(encoding="utf-8")


def _counted(tmp_path: Path, name: str, exact: int, counts: dict, localised: int = 0, failed: int = 0,
             later_divergent: int = 0) -> Path:
    d = tmp_path / "reports" / name
    d.mkdir(parents=True)
    prompts = [{"id": f"p{i}", "localization": {}} for i in range(localised)]
    prompts += [{"id": f"f{i}", "localization": {"error": "x"}} for i in range(failed)]
    (d / "report.json").write_text(json.dumps({
        "notes": [], "prompts": prompts, "later": {"later_divergent": later_divergent},
        "summary": {"prompts_exact": exact, "prompts_total": 128, "counts": counts}}), encoding="utf-8")
    return d


def test_a_cpu_rule_holds_for_any_count_of_near_ties_and_never_for_a_divergence(tmp_path):
    """A bf16 row's rule: every flip a near-tie (each localised), the count within the spread.
    111/17 (a CPU whose bf16 path flips more) passes where one machine's [112, 118] failed; a
    divergent, a missing or an unlocalised flip never does."""
    row = _step(rule="near-ties-localised", figures={"prompts_total": 128.0, "near_tie": (1.0, 32.0)},
                figures_why="bf16")
    row = msgspec.convert(msgspec.to_builtins(row), at.Step)
    ok = _counted(tmp_path, "a", 111, {"near_tie": 17, "divergent": 0, "error": 0, "missing": 0}, localised=17)
    assert at.check(row, at.Outcome(1, "", ok, 1.0), PATTERNS) == []
    bad = _counted(tmp_path, "b", 111, {"near_tie": 16, "divergent": 1, "error": 0, "missing": 0}, localised=16)
    unmet = at.check(row, at.Outcome(1, "", bad, 1.0), PATTERNS)
    assert "rule near-ties-localised: divergent = 1, expected 0" in unmet
    assert any("a flip is not a near-tie" in u for u in unmet)
    gone = _counted(tmp_path, "c", 111, {"near_tie": 17, "divergent": 0}, localised=16, failed=1)
    unmet = at.check(row, at.Outcome(1, "", gone, 1.0), PATTERNS)
    assert "rule near-ties-localised: error = absent, expected 0" in unmet
    assert any("localised 16 of 17 near-ties, 1 not localised" in u for u in unmet)


def test_the_shipped_bf16_rows_state_a_rule_not_one_machines_count():
    table = at.load_table(ROOT / "benchmarks" / "acceptance.toml")
    for step in table.step:
        if step.id in ("kda-recurrent", "demo"):
            assert step.rule is not None and "prompts_exact" not in step.figures, step.id
