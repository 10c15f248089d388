"""An interrupted `strict-gate noise` resumes where it stopped (issue 54), end to end through the CLI.

A real `strict-gate noise` process on a command engine (tests/engines/variant_engine.py, run from
the test's directory with relative paths) is killed by a real SIGKILL at a known point of its
runs: inside its K live runs, inside a variant served one prompt at a time (both continue from
their last sealed record), inside one that serves prompts together (it starts over). The engine
appends one line per generate request to a file and holds at a named request, so the test kills
at a known point and counts what `--resume` asks: exactly the uninterrupted measurement's
requests less the records kept; and the profile is the uninterrupted one's but for its clock.
No mock.
"""

from __future__ import annotations

import json
import os
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
# the runs in order, 6 prompts each: runs-2 (12 generate requests, each prompt twice in a row), the
# batch-1 run and batch-4 on one engine, chunked_prefill-2 on its own; prefill-decode scores (no generate)
NOISE = ("noise", "noise.toml", "--runs", "2", "--batch", "4", "--chunk", "2", "--out", "noise.json")
TOTAL = 12 + 6 + 6 + 6
CLOCK = {"created", "seal"}  # what differs between two measurements of one engine: when (and so its seal)


def _setup(where: Path) -> None:
    """noise.toml, its prompts and the engine, all relative to `where` (the command runs from there)."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(ENGINE, where / "variant_engine.py")
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]})
                                           + "\n" for i in range(PROMPTS)), encoding="utf-8")
    write_gate(where, file="noise.toml", prompts="p.jsonl", max_tokens=4, top_logprobs=2, output_dir="out",
               reference={"kind": "command", "command": ["python", "variant_engine.py", "--tag", "ref", "--score"],
                          "model": "variant-engine", "dtype": "float32"})


def _env(where: Path, hold: str | None = None) -> dict[str, str]:
    env = os.environ | {"COLUMNS": "200", REQUESTS: str(where / "requests.log")}
    env.pop(HOLD, None)
    return env | ({HOLD: hold} if hold else {})


def _count(where: Path, what: str = "generate") -> int:
    log = where / "requests.log"
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return sum(1 for line in lines if line.split()[:2] == ["ref", what])


def _cli(where: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], cwd=where, capture_output=True, text=True,
                          timeout=300, env=_env(where))


def _kill(where: Path, hold: str) -> Path:
    """Run `strict-gate noise` until the engine holds at its `hold`th generate request, then SIGKILL
    it (the engine, its stdin closed, ends): the report directory, relative."""
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", *NOISE], cwd=where, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(where, f"ref:generate:{hold}"))
    deadline = time.monotonic() + 120
    while _count(where) < int(hold) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"noise ended before the engine held at {hold}: {proc.communicate()[0]}"
    time.sleep(0.2)  # the engine holds: the command waits on it
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not (where / "noise.json").exists()
    (d,) = [p for p in (where / "out").iterdir() if p.is_dir()]
    return d.relative_to(where)


def _profile(where: Path) -> dict:
    raw = json.loads((where / "noise.json").read_text(encoding="utf-8"))
    raw["provenance"] = {k: v for k, v in raw["provenance"].items() if k not in CLOCK}
    return {k: v for k, v in raw.items() if k not in CLOCK}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The same measurement once without a kill: its generate requests and its profile."""
    where = tmp_path_factory.mktemp("uninterrupted")
    _setup(where)
    p = _cli(where, *NOISE)
    assert p.returncode == 0, p.stdout + p.stderr
    return {"generate": _count(where), "profile": _profile(where)}


# where the engine holds (its Nth generate request), and the requests whose records are kept then
POINTS = {
    "inside the K runs": (5, 4),  # q0 and q1 twice each; q2's first run is lost with its record
    "inside a variant served one prompt at a time": (28, 12 + 6 + 6 + 3),  # chunked_prefill-2: 3 records
    "inside a batched variant": (22, 12 + 6),  # batch-4 starts over: drawn over the whole prompt set
}


@pytest.mark.parametrize("point", list(POINTS))
def test_an_interrupted_noise_measurement_resumes_running_only_what_is_missing(tmp_path, uninterrupted, point):
    """Was: no --resume (exit 2); a new `strict-gate noise` ran all 30 generate requests again."""
    hold, kept = POINTS[point]
    _setup(tmp_path)
    d = _kill(tmp_path, hold)
    before = _count(tmp_path)
    p = _cli(tmp_path, "noise", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert uninterrupted["generate"] == TOTAL, uninterrupted
    assert _count(tmp_path) - before == TOTAL - kept, point
    assert _profile(tmp_path) == uninterrupted["profile"]


def test_a_kept_run_whose_record_does_not_match_its_seal_is_refused(tmp_path):
    _setup(tmp_path)
    d = _kill(tmp_path, 22)
    records = tmp_path / d / "runs-2" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]  # every line its own, in another order
    records.write_text("".join(lines))
    before = _count(tmp_path)
    p = _cli(tmp_path, "noise", "--resume", str(d))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "does not match the gate's seal" in (p.stdout + p.stderr).replace("\n", " ")
    assert _count(tmp_path) == before and not (tmp_path / "noise.json").exists()


def test_edited_options_are_refused(tmp_path):
    """A resume measures what the interrupted measurement set out to: its options are sealed."""
    _setup(tmp_path)
    d = _kill(tmp_path, 5)
    options = tmp_path / d / "noise-options.json"
    options.write_text(options.read_text().replace('"runs": 2', '"runs": 3'))
    p = _cli(tmp_path, "noise", "--resume", str(d))
    assert p.returncode == 2 and "were edited" in (p.stdout + p.stderr).replace("\n", " "), p.stdout + p.stderr
    q = _cli(tmp_path, "noise", "noise.toml", "--resume", str(d))
    assert q.returncode == 2 and "not both" in (q.stdout + q.stderr).replace("\n", " "), q.stdout + q.stderr
