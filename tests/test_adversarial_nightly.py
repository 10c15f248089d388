"""Hostile files for the nightly loop (issue 16, items 9, 13, 14, 15 and 20).

report.json files with the right schema and the wrong types, history.jsonl lines of other
shapes, a history that is a directory, a FIFO or 64 GiB, a drift score of -1e308, a diff of
10,000 changed prompts. Every gate here is real: stored runs, or a command engine written
below, through the CLI; nothing is mocked.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import rec, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.judge.history import HISTORY_FILE, HISTORY_MAX_BYTES, HISTORY_MAX_LINES, read_history
from strict_gate.runs.prompts import load_prompts

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
GITHUB_SUMMARY_LIMIT = 1 << 20  # GitHub refuses a step summary over 1 MiB


def gate_setup(tmp_path: Path, n: int = 2, cand=None, pid=lambda i: f"p{i}") -> Path:
    """A gate over two stored runs of n prompts; cand(i) gives prompt i's candidate tokens."""
    p = tmp_path / "set.jsonl"
    p.write_text("".join(json.dumps({"id": pid(i), "token_ids": [1, 2, 3]}) + "\n" for i in range(n)))
    sha = load_prompts(p).sha256
    write_run(tmp_path / "ref", [rec(pid(i), [5, 6, 7]) for i in range(n)], sha=sha, max_tokens=3, model="tiny")
    write_run(tmp_path / "cand", [rec(pid(i), cand(i) if cand else [5, 6, 7]) for i in range(n)], sha=sha,
              max_tokens=3, model="tiny")
    g = tmp_path / "gate.toml"
    g.write_text(
        f'name = "hist"\nprompts = "set.jsonl"\nmax_tokens = 3\npolicy = "strict"\noutput_dir = "{tmp_path / "out"}"\n'
        '[reference]\nkind = "recorded"\npath = "ref"\nmodel = "tiny"\n[candidate]\nkind = "recorded"\npath = "cand"\n'
    )
    return g


def report_dirs(out: Path) -> list[Path]:
    return sorted(d for d in out.iterdir() if d.is_dir())


def latest(out: Path) -> Path:
    return out / read_history(out)[-1]["report_dir"]


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI in its own process: a hang is a TimeoutExpired (a failure), not a stuck test run."""
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=os.environ | {"COLUMNS": "400"})


# -- item 9: --keep and the nightly's own diff.json ------------------------------------------------


def test_item9_keep_zero_or_negative_is_refused_before_anything_is_deleted(tmp_path):
    g = gate_setup(tmp_path)
    out = tmp_path / "out"
    assert runner.invoke(app, ["nightly", str(g)]).exit_code == 0
    before, history = report_dirs(out), (out / HISTORY_FILE).read_bytes()
    for keep in ("0", "-1"):
        r = runner.invoke(app, ["nightly", str(g), "--keep", keep])
        assert r.exit_code == 2, (keep, r.output)
        assert "--keep must be 1 or more" in r.output and "Traceback" not in r.output
        assert report_dirs(out) == before and (out / HISTORY_FILE).read_bytes() == history  # no gate ran


def test_item9_an_adhoc_diff_leaves_the_nightlys_diff_json_alone(tmp_path):
    g = gate_setup(tmp_path)
    out = tmp_path / "out"
    assert runner.invoke(app, ["nightly", str(g)]).exit_code == 0
    gate_setup(tmp_path, cand=lambda i: [5, 9, 7] if i == 1 else [5, 6, 7])
    assert runner.invoke(app, ["nightly", str(g)]).exit_code == 1
    night = latest(out)
    own = (night / "diff.json").read_bytes()
    assert json.loads(own)["regression"] is True
    r = runner.invoke(app, ["diff", str(night), str(night)])  # tonight against itself: no regression
    assert r.exit_code == 0 and "no regression" in r.output
    assert (night / "diff.json").read_bytes() == own
    r = runner.invoke(app, ["diff", str(night), str(night), "--json", str(tmp_path / "mine.json")])
    assert r.exit_code == 0 and json.loads((tmp_path / "mine.json").read_text())["regression"] is False
    assert (night / "diff.json").read_bytes() == own


# -- item 13: history.jsonl of another shape, not a file, or huge ---------------------------------


def test_item13_history_lines_of_another_shape_are_skipped_with_file_and_line(tmp_path):
    g = gate_setup(tmp_path)
    out = tmp_path / "out"
    assert runner.invoke(app, ["gate", str(g)]).exit_code == 0
    with open(out / HISTORY_FILE, "ab") as f:
        f.write(json.dumps({"schema": "strict-gate/history@2", "gate": "hist", "prompts": [2, 2]}).encode() + b"\n")
        f.write(b"\x00\xff not json\n")
        f.write(json.dumps({"schema": "strict-gate/history@1", "gate": "hist", "prompts": "2/2"}).encode() + b"\n")
    for night in (2, 3):  # every later gate of that name still runs
        r = runner.invoke(app, ["gate", str(g)])
        assert r.exit_code == 0, r.output
        report = json.loads((latest(out) / "report.json").read_text())
        assert [h["verdict"] for h in report["history"]] == ["pass"] * night
        notes = [n for n in report["notes"] if "history line skipped" in n]
        assert len(notes) == 3, report["notes"]
        assert f"{out / HISTORY_FILE}:2: " in notes[0] and "strict-gate/history@2" in notes[0]
        assert f"{out / HISTORY_FILE}:3: " in notes[1] and "not JSON" in notes[1]
        assert f"{out / HISTORY_FILE}:4: " in notes[2] and "field prompts" in notes[2]
        assert f"## Trend (last {night} nights)" in (latest(out) / "report.md").read_text()


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_item13_a_history_that_is_a_directory_or_a_fifo_is_exit_2_naming_it(tmp_path, kind):
    g = gate_setup(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    history = out / HISTORY_FILE
    if kind == "directory":
        history.mkdir()
    else:
        os.mkfifo(history)
    p = cli("gate", str(g), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert str(history) in p.stderr.replace("\n", "") and "Traceback" not in p.stderr
    (d,) = [x for x in report_dirs(out) if x != history]
    assert (d / "report.json").is_file()  # the gate's reports are written, then the history is refused
    p = cli("nightly", str(g), cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert str(history) in p.stderr.replace("\n", "") and "Traceback" not in p.stderr
    assert [x for x in report_dirs(out) if x != history] == [d]  # refused before its gate ran


def test_item13_a_64_gib_history_is_read_from_its_tail_and_pruned(tmp_path):
    """A sparse 64 GiB history (a hole, no disk) ending in 1,500 real lines, read and appended to
    in a process limited to 3 GiB of address space: reading it whole is a MemoryError there."""
    out = tmp_path / "out"
    out.mkdir()
    with open(out / HISTORY_FILE, "wb") as f:
        f.truncate(64 << 30)
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + b"".join(
            json.dumps({"schema": "strict-gate/history@1", "gate": "hist" if i % 2 else "other", "n": i}).encode()
            + b"\n" for i in range(1500)))
    code = (
        "import resource, json, sys\n"
        "from strict_gate.judge.history import read_history, append_history\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        f"out = {str(out)!r}\n"
        "print(json.dumps([e['n'] for e in read_history(out, 3, gate='hist')]))\n"
        "append_history(out, {'gate': 'hist', 'n': 1500})\n"
    )
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == [1495, 1497, 1499]
        assert (out / HISTORY_FILE).stat().st_size < HISTORY_MAX_BYTES  # the hole is gone
        data = (out / HISTORY_FILE).read_bytes()
    finally:
        (out / HISTORY_FILE).unlink()
    lines = data.splitlines()
    assert len(data) < HISTORY_MAX_BYTES and len(lines) == HISTORY_MAX_LINES
    assert [json.loads(x)["n"] for x in lines] == list(range(1500 - HISTORY_MAX_LINES + 1, 1501))


def test_item13_pruning_loses_no_concurrent_append(tmp_path):
    """Four processes append 100 lines each to a history at its bound, so nearly every append
    prunes (replaces the file): a writer that waited for the lock on the replaced file must
    not append to it. Each writer's kept lines are then its newest ones, without a gap."""
    with open(tmp_path / HISTORY_FILE, "w") as f:
        f.writelines(json.dumps({"schema": "strict-gate/history@1", "gate": "old", "n": i}) + "\n"
                     for i in range(HISTORY_MAX_LINES - 10))
    code = ("import sys\nfrom strict_gate.judge.history import append_history\n"
            "for i in range(100):\n    append_history(sys.argv[1], {'gate': sys.argv[2], 'n': i})\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), f"w{k}"]) for k in range(4)]
    assert [w.wait(timeout=300) for w in writers] == [0] * 4
    lines = [json.loads(x) for x in (tmp_path / HISTORY_FILE).read_bytes().splitlines()]
    assert len(lines) == HISTORY_MAX_LINES
    for k in range(4):
        ns = [e["n"] for e in lines if e["gate"] == f"w{k}"]
        assert ns == list(range(100 - len(ns), 100)), (k, ns)


# -- item 14: a finite drift score whose totals overflow ------------------------------------------

HUGE_SCORER = '''
import json, sys
def send(o):
    sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
send({"hello": "strict-gate/engine@1", "name": "huge", "version": "1", "model": "m",
      "capabilities": ["generate", "score"], "versions": {}})
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    k = req.get("top_logprobs", 1)
    if req.get("op") == "score":  # every reference token scored -1e308: finite, valid, and huge
        steps = [{"token_id": t, "logprob": -1e308, "top": [[t + 1, -0.1]] + [[t + 1000 + j, -1e308]
                  for j in range(k - 1)]} for t in req["continuation_ids"]]
        send({"id": req["id"], "steps": steps})
        continue
    toks = [req["prompt_token_ids"][-1] + i + 1 for i in range(req["max_tokens"])]
    tops = [[[t, -0.1]] + [[t + 1000 + j, -5.0 - j] for j in range(k - 1)] for t in toks]
    send({"id": req["id"], "prompt_token_ids": req["prompt_token_ids"], "token_ids": toks,
          "finish_reason": "length", "top_logprobs": tops})
'''


def test_item14_a_drift_score_of_minus_1e308_does_not_crash_a_passing_gate(tmp_path):
    engine = tmp_path / "huge.py"
    engine.write_text(HUGE_SCORER)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 20 + i, 30]}) + "\n"
                                              for i in range(3)))
    arm = f'kind = "command"\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(engine))}]\n'
    g = tmp_path / "gate.toml"
    g.write_text(f'name = "huge"\nprompts = "p.jsonl"\nmax_tokens = 3\ntop_logprobs = 2\npolicy = "strict"\n'
                 f'drift = true\noutput_dir = "{tmp_path / "out"}"\n[reference]\n{arm}[candidate]\n{arm}')
    out = tmp_path / "out"
    for night in (1, 2):
        r = runner.invoke(app, ["gate", str(g)])
        assert r.exit_code == 0, r.output
        entries = read_history(out)
        assert len(entries) == night and entries[-1]["verdict"] == "pass"
        drift = entries[-1]["drift"]
        assert drift["positions"] == 9 and drift["same_top1_rate"] == 0.0
        assert drift["abs_dlogprob"].get("mean") is None  # 9 x 1e308 overflows: no figure, not a crash
    report = json.loads((latest(out) / "report.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert [h["drift"]["positions"] for h in report["history"]] == [9, 9]


# -- item 15: report.json with the right schema and the wrong types -------------------------------

WRONG = {  # field -> a value of the wrong type (or range) for it
    "name": 5,
    "verdict": "maybe",
    "policy": 3,
    "prompts[0].passed": "yes",
    "prompts[0].matched_positions": "3",
    "prompts[1].matched_positions": -1,
    "summary": [],
    "summary.prompts_exact": "1",
    "summary.counts": {"match": "1"},
    "engines": "vllm",
    "engines.reference.versions": ["0.32"],
    "engines.candidate.options": {"replayed_from": 5},
    "prompt_set": {"sha256": 1},
    "drift": [],
    "drift.abs_dlogprob": {"mean": "x"},
    "history": {"a": 1},
    "history[0]": {"schema": "strict-gate/history@1", "prompts": "2/2"},
    "prompts[1].first_divergence.position": "2",
    "prompts[1].first_divergence.reference_top": [["a", 1]],
    "runs.reference": 5,
    "config": "gates/x.toml",
}


def _set(obj: dict, field: str, value) -> dict:
    obj = copy.deepcopy(obj)
    keys = [int(k) if k.isdigit() else k for k in field.replace("[", ".").replace("]", "").split(".")]
    target = obj
    for k in keys[:-1]:
        if isinstance(k, str) and k not in target:
            target[k] = {}
        target = target[k]
    if isinstance(target, list) and keys[-1] >= len(target):
        target.append(value)
    else:
        target[keys[-1]] = value
    return obj


@pytest.fixture(scope="module")
def good_report(tmp_path_factory) -> Path:
    """A real gate's report directory: one prompt matches, one diverges, with drift totals."""
    tmp = tmp_path_factory.mktemp("good")
    g = gate_setup(tmp, cand=lambda i: [5, 9, 7] if i == 1 else [5, 6, 7])
    assert runner.invoke(app, ["gate", str(g)]).exit_code == 1
    d = latest(tmp / "out")
    rep = json.loads((d / "report.json").read_text())
    rep["drift"] = {"same_top1_rate": 1.0, "abs_dlogprob": {"mean": 0.1}, "positions": 6, "prompts": {}}
    (d / "report.json").write_text(json.dumps(rep))
    return d


@pytest.mark.parametrize("field", list(WRONG))
def test_item15_a_wrong_typed_report_field_is_exit_2_naming_file_and_field(good_report, tmp_path, field):
    rep = _set(json.loads((good_report / "report.json").read_text()), field, WRONG[field])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text(json.dumps(rep, indent=2))
    named = "history[0]: field prompts" if field == "history[0]" else f"field {field}"
    for order in ([str(good_report), str(bad)], [str(bad), str(good_report)]):
        r = runner.invoke(app, ["diff", *order])
        assert r.exit_code == 2, (field, r.output)
        text = r.output.replace("\n", "")
        assert f"{bad / 'report.json'}: " in text and named in text, text
        assert "Traceback" not in r.output


def test_item15_show_diagnose_and_nightly_previous_refuse_a_wrong_typed_report(good_report, tmp_path):
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", str(good_report), str(bad)], check=True)
    rep = json.loads((bad / "report.json").read_text())
    for field, value in (("prompts[1].first_divergence.position", "2"), ("runs.reference", 5), ("config", "x")):
        (bad / "report.json").write_text(json.dumps(_set(rep, field, value)))
        for cmd in (["show", str(bad)], ["diagnose", str(bad)]):
            r = runner.invoke(app, cmd)
            assert r.exit_code == 2, (field, cmd, r.output)
            assert f"field {field}" in r.output.replace("\n", "") and "Traceback" not in r.output
    g = gate_setup(tmp_path)
    r = runner.invoke(app, ["nightly", str(g), "--previous", str(bad)])
    assert r.exit_code == 2 and "field config" in r.output.replace("\n", "")
    assert not (tmp_path / "out").exists()  # refused before the gate ran


def test_item15_report_at_4_is_refused_not_read_as_3(good_report, tmp_path):
    rep = json.loads((good_report / "report.json").read_text()) | {"schema": "strict-gate/report@4"}
    (tmp_path / "report.json").write_text(json.dumps(rep))
    r = runner.invoke(app, ["diff", str(good_report), str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "'strict-gate/report@4' is not one this strict-gate reads" in r.output.replace("\n", "")
    r = runner.invoke(app, ["diff", str(good_report), str(good_report)])  # report@3 (the gate's own) still reads
    assert r.exit_code == 0, r.output


def test_item15_duplicate_prompt_ids_and_a_fifo_report_are_refused(good_report, tmp_path):
    rep = json.loads((good_report / "report.json").read_text())
    rep["prompts"].append(rep["prompts"][0])  # two verdicts for one prompt: which one would diff believe?
    (tmp_path / "report.json").write_text(json.dumps(rep))
    r = runner.invoke(app, ["diff", str(good_report), str(tmp_path)])
    assert r.exit_code == 2 and "field prompts[2].id: 'p0' appears twice" in r.output.replace("\n", ""), r.output
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "report.json")
    p = cli("diff", str(good_report), str(fifo), cwd=tmp_path)
    assert p.returncode == 2 and f"{fifo / 'report.json'}: is a FIFO" in p.stderr.replace("\n", ""), p.stderr


def test_a_report_at_1_speed_is_not_read_as_a_speed_arm():
    """report@1 kept each arm's wall clock under `speed`; report@2 moved it to `wall_clock`."""
    from strict_gate.judge.stored import report_of

    wall = {"reference": {"prompts": 2, "tokens": 6, "seconds": 0.1}, "candidate": None}
    assert report_of({"schema": "strict-gate/report@1", "prompts": [], "speed": wall}).speed is None
    assert report_of({"schema": "strict-gate/report@2", "prompts": [], "speed": {"rungs": []}}).speed == {"rungs": []}


# -- item 20: the step summary of 10,000 changed prompts ------------------------------------------


def battery_id(i: int) -> str:
    """A prompt id as a large battery names them (ids are the user's: any length)."""
    return f"sensitive-battery/multilingual/code-and-prose/long-context/near-tie-probes/{i:05d}"


def last_night_all_matching(path: Path, n: int) -> Path:
    """Last night's report.json, written by hand: the same n prompts, every one matching."""
    path.mkdir()
    prompts = [{"id": battery_id(i), "status": "match", "passed": True, "matched_positions": 3} for i in range(n)]
    summary = {"prompts_total": n, "prompts_exact": n, "positions_total": 3 * n, "positions_matched": 3 * n,
               "counts": {"match": n}}
    (path / "report.json").write_text(json.dumps({"schema": "strict-gate/report@2", "name": "hist", "verdict": "pass",
                                                  "summary": summary, "prompts": prompts}))
    return path


def test_item20_a_summary_over_the_limit_is_cut_under_it_keeping_its_head(tmp_path, monkeypatch):
    """The CI tier's test of the size bound item20's 10,000-prompt nightly keeps in the slow tier:
    both files a job summary goes to stay under GitHub's limit, verdict first, the cut said."""
    from strict_gate.report.job_summary import write_summary

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", "step.md")
    write_summary("# FAIL: hist — 0/10000 prompts exact\n" + "| p | x |\n" * 300_000, "s.md")
    for path in (Path("step.md"), Path("s.md")):
        text = path.read_text()
        assert len(text.encode()) < GITHUB_SUMMARY_LIMIT, (path, len(text.encode()))
        assert text.startswith("# FAIL: hist — 0/10000 prompts exact") and "summary cut at" in text


def test_item20_the_summary_of_10000_changed_prompts_stays_under_1_mib(tmp_path, monkeypatch):
    n = 10_000
    g = gate_setup(tmp_path, n, cand=lambda i: [5, 6, 8], pid=battery_id)  # every prompt diverges at its last token
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    r = runner.invoke(app, ["nightly", str(g), "--previous", str(last_night_all_matching(tmp_path / "n1", n)),
                            "--summary", str(tmp_path / "s.md")])
    assert r.exit_code == 1, r.output
    night = latest(tmp_path / "out")
    assert len(json.loads((night / "diff.json").read_text())["changes"]) == n  # diff.json keeps every one
    for path in (step, tmp_path / "s.md", night / "summary.md"):
        text = path.read_text()
        assert len(text.encode()) < GITHUB_SUMMARY_LIMIT, (path, len(text.encode()))
        assert text.startswith("# FAIL: hist — 0/10000 prompts exact"), text[:200]
        assert "## Night to night: REGRESSION (new-failure, status-worse, positions-drop)" in text
        assert f"… and {n - 50} more prompts changed: diff.json lists every one." in text
