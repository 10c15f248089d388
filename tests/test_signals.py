"""No engine process survives the gate, whatever signal arrives when.

Each test runs a real `strict-gate gate` in a subprocess whose candidate is a real child
process (tests/engines/fake_engine.py over the command protocol, or the fake OpenAI server
tests/engines/fake_openai_server.py launched with `serve`), waits for a chosen moment (the engine's
events file says it is generating, shutting down, or ignoring a SIGTERM), signals the gate,
and checks that the gate exits 3 and that every process of the engine is gone right after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import pid_alive, write_gate

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "engines" / "fake_engine.py"
FAKE_SERVER = ROOT / "tests" / "engines" / "fake_openai_server.py"



@pytest.fixture(autouse=True)
def _reap(tmp_path):
    """Whatever a failing test left running (the pids its engines wrote) is killed afterwards."""
    yield
    for pidfile in tmp_path.glob("*.pid"):
        for pid in _pids(pidfile):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _events(path: Path) -> list[str]:
    return path.read_text().split("\n") if path.exists() else []


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


class Gate:
    """A `strict-gate gate` subprocess over a config whose candidate is `candidate` (an arm table)."""

    def __init__(self, tmp_path: Path, candidate: dict[str, Any], n_prompts: int = 3):
        (tmp_path / "p.jsonl").write_text(
            "".join(json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n" for i in range(n_prompts))
        )
        ref = [sys.executable, str(FAKE), "--pidfile", str(tmp_path / "ref.pid")]
        write_gate(tmp_path, name="sig", prompts="p.jsonl", max_tokens=2, top_logprobs=2, output_dir=tmp_path / "r",
                   reference={"kind": "command", "command": ref}, candidate=candidate)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.tmp = tmp_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "strict_gate.cli", "gate", str(tmp_path / "gate.toml")],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def signal(self, sig: int, times: int = 1) -> float:
        t0 = time.monotonic()
        for _ in range(times):
            self.proc.send_signal(sig)
            time.sleep(0.1)
        return t0

    def exit(self, timeout: float = 30) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"the gate did not exit within {timeout} s:\n{out}")
        return self.proc.returncode, out


def _command_arm(tmp_path: Path, *flags: str) -> dict[str, Any]:
    argv = [sys.executable, str(FAKE), "--pidfile", str(tmp_path / "cand.pid"),
            "--events", str(tmp_path / "cand.events"), *flags]
    return {"kind": "command", "command": argv, "timeout_s": 120}


def _assert_gone(pids: list[int], out: str) -> None:
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"engine processes {alive} survived the gate:\n{out}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_during_generation(tmp_path, sig):
    gate = Gate(tmp_path, _command_arm(tmp_path, "--mode", "hang"))
    events = tmp_path / "cand.events"
    _wait_for(lambda: "request p0" in _events(events), 30, "the candidate's first request")
    gate.signal(sig)
    code, out = gate.exit()
    assert code == 3, out
    assert "interrupted" in out
    _assert_gone(_pids(tmp_path / "cand.pid"), out)
    assert not (tmp_path / "ref.pid").exists()  # the reference never started


def test_signal_during_a_slow_shutdown_cuts_it_short(tmp_path):
    # The engine takes 120 s to shut down; the SIGTERM landing in the gate's 5 s shutdown wait
    # used to abort close() and leave the engine running.
    gate = Gate(tmp_path, _command_arm(tmp_path, "--shutdown-delay", "120"))
    events = tmp_path / "cand.events"
    _wait_for(lambda: "shutdown" in _events(events), 30, "the candidate's shutdown")
    t0 = gate.signal(signal.SIGTERM)
    code, out = gate.exit()
    assert code == 3, out
    assert time.monotonic() - t0 < 4, "the signal must cut the 5 s shutdown grace short"
    _assert_gone(_pids(tmp_path / "cand.pid"), out)


def test_repeated_ctrl_c_during_shutdown_of_an_engine_ignoring_sigterm(tmp_path):
    gate = Gate(tmp_path, _command_arm(tmp_path, "--shutdown-delay", "120", "--ignore-term"))
    events = tmp_path / "cand.events"
    _wait_for(lambda: "shutdown" in _events(events), 30, "the candidate's shutdown")
    gate.signal(signal.SIGINT, times=5)
    code, out = gate.exit()
    assert code == 3, out
    assert out.count("interrupted") == 1
    _assert_gone(_pids(tmp_path / "cand.pid"), out)


def test_engine_ignoring_sigterm_is_killed(tmp_path):
    gate = Gate(tmp_path, _command_arm(tmp_path, "--mode", "hang", "--ignore-term"))
    events = tmp_path / "cand.events"
    _wait_for(lambda: "request p0" in _events(events), 30, "the candidate's first request")
    gate.signal(signal.SIGTERM)
    code, out = gate.exit()
    assert code == 3, out
    assert "sigterm" in _events(events)  # it was asked, ignored it, and was killed anyway
    _assert_gone(_pids(tmp_path / "cand.pid"), out)


def test_an_engine_never_closed_is_stopped_at_exit(tmp_path):
    """The atexit net: a script that starts an engine and exits without close() leaves nothing."""
    code = (
        "import sys\n"
        "from strict_gate.engines.command.engine import CommandEngine, CommandOptions\n"
        f"eng = CommandEngine(CommandOptions(command=[sys.executable, {str(FAKE)!r}, '--ignore-term', '--shutdown-delay', '120', "
        f"'--pidfile', {str(tmp_path / 'cand.pid')!r}]))\n"
        "eng.start()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    _assert_gone(_pids(tmp_path / "cand.pid"), out.stderr)


def _serve_arm(tmp_path: Path, *flags: str, stop_timeout_s: float = 30) -> dict[str, Any]:
    argv = [sys.executable, str(FAKE_SERVER), "--port", "{port}", "--spawn-child",
            "--pidfile", str(tmp_path / "cand.pid"), "--events", str(tmp_path / "cand.events"), *flags]
    return {"kind": "openai", "serve": argv, "startup_timeout_s": 60, "request_timeout_s": 30, "retries": 0,
            "stop_timeout_s": stop_timeout_s}


def test_signal_during_generation_stops_a_launched_server(tmp_path):
    gate = Gate(tmp_path, _serve_arm(tmp_path, "--delay", "5"))
    events = tmp_path / "cand.events"
    _wait_for(lambda: "request" in _events(events), 60, "the server's first completion request")
    gate.signal(signal.SIGTERM)
    code, out = gate.exit()
    assert code == 3, out
    pids = _pids(tmp_path / "cand.pid")
    assert len(pids) == 2  # the server and the child it started (vLLM's engine core, say)
    _assert_gone(pids, out)


def test_signal_while_a_launched_server_ignores_sigterm(tmp_path):
    # close() sent SIGTERM, the server ignores it, the gate would wait stop_timeout_s = 60 s:
    # a Ctrl-C then means "now": SIGKILL at once, and the gate still exits cleanly.
    gate = Gate(tmp_path, _serve_arm(tmp_path, "--ignore-term", stop_timeout_s=60))
    events = tmp_path / "cand.events"
    _wait_for(lambda: "sigterm" in _events(events), 60, "the SIGTERM of close()")
    t0 = gate.signal(signal.SIGINT)
    code, out = gate.exit()
    assert code == 3, out
    assert time.monotonic() - t0 < 10
    _assert_gone(_pids(tmp_path / "cand.pid"), out)


def test_signal_while_a_launched_server_starts(tmp_path):
    gate = Gate(tmp_path, _serve_arm(tmp_path, "--slow-start"))
    _wait_for(lambda: (tmp_path / "cand.pid").exists(), 60, "the server's launch")
    gate.signal(signal.SIGTERM)
    code, out = gate.exit()
    assert code == 3, out
    assert "request" not in _events(tmp_path / "cand.events")  # it was stopped before any prompt
    _assert_gone(_pids(tmp_path / "cand.pid"), out)
