"""`strict-gate diff`: night-to-night changes of hand-built report.json pairs (no engine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.errors import ConfigError
from strict_gate.judge.compare import Status
from strict_gate.nightly.diff import Rule, diff_report_files, diff_reports, parse_fail_on
from strict_gate.nightly.diff_markdown import render_markdown

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def prompt(pid, status="match", matched=4, length=4):
    p = {"id": pid, "status": status, "passed": status == "match", "rule": "strict",
         "matched_positions": matched, "reference_length": length, "candidate_length": length}
    if status != "match":
        p |= {"reason": status, "first_divergence": None, "prefix_length": matched, "diagnosis": None}
    return p


def report(prompts, *, verdict=None, vllm="0.32.0", baseline="baselines/b", drift=None, sha="a" * 64):
    exact = sum(p["status"] == "match" for p in prompts)
    counts = {s.value: sum(p["status"] == s for p in prompts) for s in Status}
    r = {
        "schema": "strict-gate/report@1", "name": "nightly", "created": "2026-11-30T03:00:00+00:00",
        "verdict": verdict or ("pass" if exact == len(prompts) else "fail"), "policy": "auto",
        "summary": {"prompts_total": len(prompts), "prompts_exact": exact,
                    "positions_total": sum(p["reference_length"] for p in prompts),
                    "positions_matched": sum(p["matched_positions"] for p in prompts), "counts": counts},
        "prompt_set": {"name": "s", "sha256": sha, "count": len(prompts)},
        "engines": {
            "reference": {"kind": "vllm", "model": "bundled:tiny-llama", "options": {"replayed_from": baseline},
                          "versions": {"vllm": vllm}},
            "candidate": {"kind": "hf", "model": "bundled:tiny-llama", "options": {}, "versions": {"torch": "2.13"}},
        },
        "prompts": prompts,
    }
    if drift is not None:
        r["drift"] = drift
    return r


def write(tmp_path, name, rep) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps(rep))
    return d


def drift(mean=0.01, margin=0.5, same=1.0):
    return {"same_top1_rate": same, "abs_dlogprob": {"mean": mean, "p99": mean * 3, "max": mean * 5},
            "kl": {"estimator": "topk", "mean": mean / 10}, "min_reference_margin": margin,
            "positions_within_band": 60, "positions": 64, "prompts": {"p0": {"id": "p0"}}}


OLD = [prompt("p0"), prompt("p1"), prompt("p2", "near_tie", 2), prompt("p3", "divergent", 1), prompt("gone")]
NEW = [prompt("p0"), prompt("p1", "near_tie", 3), prompt("p2", "divergent", 2), prompt("p3"), prompt("fresh"),
       prompt("fresh-bad", "error", 0, 0)]


def test_every_kind_of_change():
    d = diff_reports(report(OLD), report(NEW, vllm="0.33.0", baseline="baselines/c", sha="b" * 64))
    assert d.stopped_matching == ("p1",) and d.started_matching == ("p3",)
    by_id = {c.id: c for c in d.changes}
    assert set(by_id) == {"p1", "p2", "p3"}
    assert (by_id["p2"].old_status, by_id["p2"].new_status) == (Status.NEAR_TIE, Status.DIVERGENT)
    assert by_id["p1"].worse and by_id["p2"].worse and not by_id["p3"].worse
    assert d.added == ("fresh", "fresh-bad") and d.removed == ("gone",) and d.added_failing == ("fresh-bad",)
    assert d.positions_common == (4 + 4 + 2 + 1, 4 + 3 + 2 + 4)
    rules = {r.rule: r for r in d.regressions}
    assert rules[Rule.NEW_FAILURE].prompts == ("p1", "fresh-bad")
    assert rules[Rule.STATUS_WORSE].prompts == ("p1", "p2")
    assert Rule.POSITIONS_DROP not in rules  # 11 -> 13 over the common prompts
    assert d.exit_code == 1
    context = {c.what: (c.old, c.new) for c in d.context}
    assert context["reference vllm version"] == ("0.32.0", "0.33.0")
    assert context["reference baseline"] == ("baselines/b", "baselines/c")
    assert context["prompt set sha256"] == ("a" * 64, "b" * 64)
    assert "candidate torch version" not in context
    md = render_markdown(d)
    assert md.startswith("## Night to night: REGRESSION (new-failure, status-worse)")
    assert "| p2 | near_tie | divergent | no -> no | 2 -> 2 |" in md
    assert "removed 1: gone" in md and "fresh-bad (1 failing: fresh-bad)" in md and "reference vllm version | 0.32.0 | 0.33.0" in md
    assert "neither night has drift figures" in md


def test_back_to_match_and_positions_drop():
    old = [prompt("p0", "near_tie", 3), prompt("p1", "match", 4)]
    better = diff_reports(report(old), report([prompt("p0"), prompt("p1")]))
    assert better.started_matching == ("p0",) and better.regressions == () and better.exit_code == 0
    # the same status, fewer positions: only positions-drop sees it
    worse = diff_reports(report([prompt("p0", "divergent", 3)]), report([prompt("p0", "divergent", 1)]))
    assert [r.rule for r in worse.regressions] == [Rule.POSITIONS_DROP] and worse.regressions[0].prompts == ("p0",)
    assert worse.exit_code == 1
    assert diff_reports(report([prompt("p0", "divergent", 3)]), report([prompt("p0", "divergent", 1)]),
                        fail_on=(Rule.NEW_FAILURE,)).exit_code == 0
    same = diff_reports(report(OLD), report(OLD))
    assert same.changes == () and same.context == () and same.exit_code == 0
    assert "## Night to night: no regression" in render_markdown(same)


def test_drift_totals_and_drift_worse():
    old, new = report(OLD[:2], drift=drift()), report(OLD[:2], drift=drift(mean=0.02, margin=0.3))
    d = diff_reports(old, new)
    worse = {x.metric for x in d.drift if x.worse}
    assert worse == {"abs_dlogprob.mean", "abs_dlogprob.p99", "abs_dlogprob.max", "kl.mean", "min_reference_margin"}
    assert d.exit_code == 0 and [r.rule for r in d.regressions] == [Rule.DRIFT_WORSE]  # not failing by default
    assert diff_reports(old, new, fail_on=parse_fail_on("drift-worse")).exit_code == 1
    assert diff_reports(new, old, fail_on=(Rule.DRIFT_WORSE,)).exit_code == 0
    md = render_markdown(d)
    assert "| min\\_reference\\_margin | 0.5 | 0.3 | -0.2 (worse) |" in md and "reported only" in md
    only_new = diff_reports(report(OLD[:2]), new, fail_on=tuple(Rule))
    assert only_new.drift == () and "last night has no drift figures" in only_new.drift_note
    assert only_new.exit_code == 0


def test_parse_fail_on():
    assert parse_fail_on("new-failure, positions-drop") == (Rule.NEW_FAILURE, Rule.POSITIONS_DROP)
    assert parse_fail_on("none") == () and parse_fail_on("") == ()
    with pytest.raises(ConfigError, match="did you mean 'status-worse'"):
        parse_fail_on("status-wors")


def test_cli_exit_codes_and_diff_json(tmp_path):
    old, new = write(tmp_path, "n1", report(OLD)), write(tmp_path, "n2", report(NEW))
    r = runner.invoke(app, ["diff", str(old), str(new / "report.json")])
    assert r.exit_code == 1, r.output
    assert "REGRESSION" in r.output and "p1" in r.output
    assert not (new / "diff.json").exists()  # written only where --json says (docs/nightly.md)
    r = runner.invoke(app, ["diff", str(old), str(new / "report.json"), "--json", str(new / "diff.json")])
    assert r.exit_code == 1, r.output
    dj = json.loads((new / "diff.json").read_text())
    assert dj["schema"] == "strict-gate/diff@1" and dj["regression"] is True
    assert dj["stopped_matching"] == ["p1"] and dj["added"] == ["fresh", "fresh-bad"] and dj["removed"] == ["gone"]
    r = runner.invoke(app, ["diff", str(old), str(new), "--fail-on", "none", "--json", str(tmp_path / "d.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "d.json").read_text())["regression"] is False
    r = runner.invoke(app, ["diff", str(old), str(old)])
    assert r.exit_code == 0 and "no regression" in r.output


def test_bad_input_is_exit_2_with_the_path(tmp_path):
    good = write(tmp_path, "good", report(OLD))
    cases = {
        "missing": None,
        "junk": "{\n  \"schema\": \"strict-gate/report@1\",\n  oops\n}",
        "other": json.dumps({"schema": "strict-gate/run@1"}),
        "badstatus": json.dumps(report([prompt("p0") | {"status": "great"}])),
    }
    for name, text in cases.items():
        d = tmp_path / name
        if text is not None:
            d.mkdir()
            (d / "report.json").write_text(text)
        r = runner.invoke(app, ["diff", str(good), str(d)])
        assert r.exit_code == 2, (name, r.output)
        where = d if text is None else d / "report.json"
        assert f"{where}:" in r.output.replace("\n", "") and "Traceback" not in r.output
    r = runner.invoke(app, ["diff", str(good), str(tmp_path / "junk")])
    assert "report.json:3:" in r.output.replace("\n", "")
    r = runner.invoke(app, ["diff", str(good), str(good), "--json", str(good / "report.json" / "d.json")])
    assert r.exit_code == 2 and "cannot write the diff" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["diff", str(good), str(good), "--fail-on", "bogus"])
    assert r.exit_code == 2 and "unknown rule 'bogus'" in r.output


def test_diff_runs_without_torch(tmp_path):
    """diff is for a bare install: importing it and running it loads no torch, transformers or vLLM."""
    old, new = write(tmp_path, "n1", report(OLD)), write(tmp_path, "n2", report(NEW))
    code = (
        "import sys\nfrom strict_gate.cli import app\n"
        f"try:\n    app(['diff', {str(old)!r}, {str(new)!r}])\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\nsys.exit(code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1, out.stderr


def test_library_reads_report_dirs_and_files(tmp_path):
    old, new = write(tmp_path, "n1", report(OLD)), write(tmp_path, "n2", report(NEW))
    a = diff_report_files(old, new)
    b = diff_report_files(old / "report.json", new / "report.json")
    assert a.changes == b.changes and a.old.path == str(old / "report.json")
