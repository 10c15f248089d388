"""Issue 50, item 3: a helper an engine starts in a session of its own (setsid, start_new_session)
is outside the engine's process group, so stopping the group missed it; it outlived the gate after
a normal end and after SIGKILL of the gate. Each test runs a real `strict-gate gate` from its
working directory with relative paths, with a command engine (tests/engines/session_helper.py)
that starts such a helper and writes its pid to a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import pid_alive

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "engines" / "fake_engine.py"
SESSION_HELPER = ROOT / "tests" / "engines" / "session_helper.py"



def _wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def helpers(tmp_path, monkeypatch):
    """Run from tmp_path; afterwards, kill whatever helper a failing test left running."""
    monkeypatch.chdir(tmp_path)
    if not Path("/proc").is_dir():
        pytest.skip("finding an engine's helpers needs /proc")
    yield tmp_path
    for pidfile in tmp_path.glob("*.pid"):
        for pid in map(int, pidfile.read_text().split()):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _gate(candidate_args: list[str]) -> subprocess.Popen:
    """A gate whose candidate starts a helper in its own session (helper.pid), by relative paths."""
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n"
                                       for i in range(3)))
    cand = [sys.executable, str(SESSION_HELPER), "helper.pid", *candidate_args]
    Path("gate.toml").write_text(
        'name = "session"\nprompts = "p.jsonl"\nmax_tokens = 2\ntop_logprobs = 2\noutput_dir = "r"\n'
        f'[reference]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(FAKE)])}\n'
        f'[candidate]\nkind = "command"\ncommand = {json.dumps(cand)}\ntimeout_s = 300\n')
    return subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", "gate.toml"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _helper() -> int:
    assert _wait_for(lambda: Path("helper.pid").exists() and Path("helper.pid").read_text().strip(), 60)
    pid = int(Path("helper.pid").read_text())
    return pid


def test_a_helper_in_its_own_session_does_not_outlive_a_gate_that_ends(helpers):
    gate = _gate([])
    out, _ = gate.communicate(timeout=120)
    assert gate.returncode == 0, out
    pid = _helper()
    assert not pid_alive(pid), f"the engine's helper {pid} (its own session) outlived the gate"


def test_a_helper_in_its_own_session_does_not_outlive_a_sigkilled_gate(helpers):
    gate = _gate(["--mode", "hang", "--events", "cand.events"])
    try:
        assert _wait_for(lambda: "request p0" in (Path("cand.events").read_text()
                                                   if Path("cand.events").exists() else ""), 60)
        pid = _helper()
        assert pid_alive(pid)
        gate.send_signal(signal.SIGKILL)  # nothing of the gate's own runs after this
        gate.communicate(timeout=30)
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.communicate()
    assert _wait_for(lambda: not pid_alive(pid), 20), f"the engine's helper {pid} outlived the SIGKILLed gate"


def test_stopping_an_engine_process_stops_what_it_started_in_another_session(helpers):
    from strict_gate.engines.process import spawn, stop_group

    script = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              "time.sleep(300)'], start_new_session=True); open('inner.pid', 'w').write(str(p.pid)); time.sleep(300)")
    proc = spawn([sys.executable, "-c", script], {}, ".", stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert _wait_for(lambda: Path("inner.pid").exists() and Path("inner.pid").read_text(), 30)
    pid = int(Path("inner.pid").read_text())
    stop_group(proc, proc.pid, 2.0, 5.0)
    assert not pid_alive(pid)
