"""An interrupted invariance phase resumes where it stopped (issue 54), end to end through the CLI.

A real gate process (command engines: tests/engines/variant_engine.py, run from the test's
directory with relative paths) is stopped by a real SIGINT, then a SIGKILL, at each point of its
invariance phase: inside the candidate's batch-1 run, between two variants, inside a variant
served one prompt at a time (it continues from its last record), inside one that serves prompts
together (it starts over). The engine appends one line per generate request to a file and holds
at a named request, so the test signals at a known point and counts what `--resume` asks: exactly
the uninterrupted gate's requests less the records kept, and the final reports are the
uninterrupted gate's but for timings. No mock.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import write_gate

ENGINE = Path(__file__).resolve().parent / "engines" / "variant_engine.py"
REQUESTS, HOLD = "VARIANT_ENGINE_REQUESTS", "VARIANT_ENGINE_HOLD"
PROMPTS = 6
# the candidate's runs in order: its arm, then [invariance]: the batch-1 run and batch-4 on one
# engine, then chunked_prefill-2 and chunked_prefill-3 on an engine each (6 generate requests a run)
INVARIANCE = {"batch": [4], "chunked_prefill": [2, 3], "policy": "strict"}
# what differs between two runs of one gate: the clock, and the pid an engine's hello names
TIMING_KEYS = {"created", "finished", "seconds", "baseline_seconds", "cost", "timing", "started", "at", "time",
               "tokens_per_s", "pid"}


def _setup(where: Path) -> Path:
    """gate.toml, its prompts and the engine, all relative to `where` (the gate runs from there)."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(ENGINE, where / "variant_engine.py")
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]})
                                           + "\n" for i in range(PROMPTS)), encoding="utf-8")
    return write_gate(where, prompts="p.jsonl", max_tokens=4, top_logprobs=2, output_dir="out", policy="strict",
                      reference={"kind": "command", "command": ["python", "variant_engine.py", "--tag", "ref"]},
                      candidate={"kind": "command", "command": ["python", "variant_engine.py", "--tag", "cand"],
                                 "timeout_s": 30.0},
                      invariance=INVARIANCE)


def _env(where: Path, hold: str | None = None) -> dict[str, str]:
    env = os.environ | {"COLUMNS": "200", REQUESTS: str(where / "requests.log")}
    env.pop(HOLD, None)
    return env | ({HOLD: hold} if hold else {})


def _count(where: Path, what: str = "generate", tag: str = "cand") -> int:
    log = where / "requests.log"
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return sum(1 for line in lines if line.split()[:2] == [tag, what])


def _cli(where: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], cwd=where, capture_output=True, text=True,
                          timeout=300, env=_env(where))


def _interrupt(where: Path, hold: str, sig: int, command: str = "gate") -> tuple[Path, str]:
    """Run `strict-gate COMMAND gate.toml` until the engine holds at `hold`, then send `sig`: the
    report directory (relative) and what the gate said."""
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", command, "gate.toml"], cwd=where,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(where, hold))
    tag, what, n = hold.split(":")
    deadline = time.monotonic() + 120
    while _count(where, what, tag) < int(n) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the gate ended before the engine held at {hold}: {proc.communicate()[0]}"
    time.sleep(0.2)  # the engine holds: the gate waits on it
    os.kill(proc.pid, sig)
    said = proc.communicate(timeout=120)[0]
    assert proc.returncode == (3 if sig == signal.SIGINT else -signal.SIGKILL), said
    (d,) = [p for p in (where / "out").iterdir() if p.is_dir()]
    return d.relative_to(where), said


def _normal(text: str, where: Path, report: Path) -> str:
    """Paths of this run's directory and report directory said alike (report.md escapes "_")."""
    root = str(where.resolve())
    return text.replace(root, "<root>").replace(root.replace("_", "\\_"), "<root>").replace(report.name, "<report>")


def _drop_timings(value):
    if isinstance(value, dict):
        return {k: _drop_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_drop_timings(v) for v in value]
    return value


def _untimed(text: str) -> str:
    """A report's text without its clock: every decimal here is a timing (the arms' and variants'
    throughput, seconds and cost; both engines agree exactly, so no logprob gap is printed), and
    the engines' pids."""
    return re.sub(r"\d+\.\d+", "<t>", re.sub(r"'pid': \d+", "'pid': <pid>", text))


def _reports(where: Path, report: Path) -> dict[str, object]:
    """report.json without its timings, junit.xml without time attributes, both texts untimed."""
    d = where / report
    out: dict[str, object] = {
        "json": _drop_timings(json.loads(_normal((d / "report.json").read_text(), where, report)))}
    out["junit"] = _untimed(re.sub(r' time="[^"]*"', "", _normal((d / "junit.xml").read_text(), where, report)))
    out["md"] = _untimed(_normal((d / "report.md").read_text(), where, report))
    return out


def _same_reports(got: dict, want: dict) -> None:
    """Equal, or the lines that differ."""
    for fmt in ("json", "junit", "md"):
        a = json.dumps(got[fmt], indent=1, sort_keys=True) if fmt == "json" else got[fmt]
        b = json.dumps(want[fmt], indent=1, sort_keys=True) if fmt == "json" else want[fmt]
        assert a == b, "\n".join(difflib.unified_diff(b.splitlines(), a.splitlines(), "uninterrupted", "resumed",
                                                        lineterm="", n=1))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The same gate run once without a signal: its generate and start counts, and its reports."""
    where = tmp_path_factory.mktemp("uninterrupted")
    _setup(where)
    p = _cli(where, "gate", "gate.toml")
    assert p.returncode == 0, p.stdout + p.stderr
    (d,) = [x.relative_to(where) for x in (where / "out").iterdir() if x.is_dir()]
    return {"generate": _count(where), "start": _count(where, "start"), "reports": _reports(where, d)}


# (what the engine holds at, the records kept when it is signalled, what the interrupt names)
POINTS = {
    "during the baseline": ("cand:generate:9", 6 + 2, "the invariance phase: candidate arm, the batch-1 run, "
                                                      "2 of 6 records done"),
    "between variants": ("cand:start:3", 6 + 6 + 6, "the invariance phase, between runs: invariance, candidate arm, "
                                                    "variant batch-4 had finished (6 of 6 records), the next had not "
                                                    "begun"),
    "inside a variant": ("cand:generate:22", 6 + 6 + 6 + 3, "the invariance phase: candidate arm, variant "
                                                             "chunked_prefill-2, 3 of 6 records done"),
    "inside a batched variant": ("cand:generate:18", 6 + 6, "the invariance phase: candidate arm, variant batch-4, "
                                                            "4 of 6 records done"),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
@pytest.mark.parametrize("point", list(POINTS))
def test_an_interrupted_invariance_phase_resumes_running_only_what_is_missing(tmp_path, uninterrupted, point, sig):
    """Was: every resume ran the invariance phase from its start (24 generate requests, each
    baseline and variant again) and a SIGINT said "runs marked failed: none (no arm had started)"."""
    hold, kept, where = POINTS[point]
    _setup(tmp_path)
    d, said = _interrupt(tmp_path, hold, sig)
    assert not (tmp_path / d / "report.json").exists()
    if sig == signal.SIGINT:
        flat = said.replace("\n", "")
        assert f"interrupted: {where}" in flat, said
        assert "--resume keeps: candidate arm (6 records); reference arm (6 records)" in flat, said
        assert f"continue with: strict-gate gate --resume {d}" in flat, said
        assert "no arm had started" not in flat, said
    before, starts = _count(tmp_path), _count(tmp_path, "start")
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    resumed = _count(tmp_path) - before
    assert uninterrupted["generate"] == 30, uninterrupted
    assert resumed == uninterrupted["generate"] - kept, (point, resumed)
    if point == "between variants":  # the batch-1 run and batch-4 were kept: their engine is not started
        assert _count(tmp_path, "start") - starts == 2
    _same_reports(_reports(tmp_path, d), uninterrupted["reports"])


def test_the_interrupt_says_what_resume_keeps_continues_and_runs_again(tmp_path):
    _setup(tmp_path)
    d, said = _interrupt(tmp_path, "cand:generate:22", signal.SIGINT)
    flat = said.replace("\n", "")
    assert f"runs marked failed: out/{d.name}/invariance/candidate/chunked_prefill-2" in flat, said
    assert ("--resume keeps: candidate arm (6 records); reference arm (6 records); invariance, candidate arm, the "
            "batch-1 run (6 records); invariance, candidate arm, variant batch-4 (6 records)") in flat, said
    assert "--resume continues: invariance, candidate arm, variant chunked_prefill-2 (3 of 6 records kept, 3 to " \
           "generate)" in flat, said
    assert "--resume runs, not started yet: invariance, candidate arm, variant chunked_prefill-3" in flat, said


def test_a_kept_variant_record_that_does_not_match_its_seal_is_refused(tmp_path):
    _setup(tmp_path)
    d, _ = _interrupt(tmp_path, "cand:generate:22", signal.SIGKILL)
    records = tmp_path / d / "invariance" / "candidate" / "batch-4" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]  # every line its own, in another order
    records.write_text("".join(lines))
    before = _count(tmp_path)
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "does not match the gate's seal" in (p.stdout + p.stderr).replace("\n", " ")
    assert _count(tmp_path) == before  # refused before any engine was asked


def test_an_unsealed_tail_of_a_variant_run_is_generated_again(tmp_path, uninterrupted):
    """A kill between a record and its seal: the record is dropped and generated again."""
    _setup(tmp_path)
    d, _ = _interrupt(tmp_path, "cand:generate:22", signal.SIGKILL)
    seal = tmp_path / d / "invariance" / "candidate" / "chunked_prefill-2" / "records.seal"
    seal.write_text("".join(seal.read_text().splitlines(keepends=True)[:-1]))
    before = _count(tmp_path)
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _count(tmp_path) - before == uninterrupted["generate"] - (6 + 6 + 6 + 2)
    _same_reports(_reports(tmp_path, d), uninterrupted["reports"])


def test_strict_gate_invariance_resumes_too(tmp_path, tmp_path_factory):
    """`strict-gate invariance --resume REPORT_DIR`: was no such option."""
    fresh = tmp_path_factory.mktemp("invariance-uninterrupted")
    _setup(fresh)
    p = _cli(fresh, "invariance", "gate.toml")
    assert p.returncode == 0, p.stdout + p.stderr
    (u,) = [x.relative_to(fresh) for x in (fresh / "out").iterdir() if x.is_dir()]
    assert _count(fresh) == 24
    _setup(tmp_path)
    d, _ = _interrupt(tmp_path, "cand:generate:15", signal.SIGKILL, command="invariance")  # chunked_prefill-2's 3rd
    before = _count(tmp_path)
    p = _cli(tmp_path, "invariance", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _count(tmp_path) - before == 24 - (6 + 6 + 2)

    def doc(where: Path, report: Path):
        return _drop_timings(json.loads(_normal((where / report / "invariance.json").read_text(), where, report)))

    assert doc(tmp_path, d) == doc(fresh, u)
    again = _cli(tmp_path, "invariance", "--resume", str(d))
    assert again.returncode == 0 and "nothing to resume" in again.stderr.replace("\n", " "), again.stderr
    assert _count(tmp_path) - before == 24 - (6 + 6 + 2)
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == 2 and "strict-gate invariance --resume" in (p.stdout + p.stderr).replace("\n", " ")
