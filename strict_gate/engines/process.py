"""Child processes of the out-of-process engines (command, openai): launch, log, stop.

An engine process runs in a process group of its own so that stopping it also stops
everything it started (vLLM's engine-core and workers, a binary's helpers): the group is
what we signal and what we wait for. Its output goes to a log file whose tail the engines
quote when it dies.

No engine process may outlive the gate, whatever signal arrives when. Hence:
- a cleanup (stop_group, an engine's close()) runs inside `signals_deferred()`: a Ctrl-C or
  SIGTERM arriving then does not abort it half-way (which would leave the group running, as
  it lives in a session of its own and never sees the terminal's signals); it cuts the grace
  periods short instead (`interrupted()`), and is re-delivered once the group is gone;
- under the CLI (`interrupt_once`) only the first signal interrupts; later ones hurry the
  cleanup under way instead of aborting it;
- every group spawned here is registered until it is stopped, and an atexit handler stops
  whatever is left (an engine never closed, a spawn interrupted before its engine saw it).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

POLL_S = 0.05  # how often stop_group looks at the group
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_TERM_GRACE_S = 2.0  # the atexit net: SIGTERM grace before SIGKILL
EXIT_KILL_WAIT_S = 5.0

_live: dict[int, subprocess.Popen] = {}  # pgid -> leader of every group spawned and not yet stopped
_held: list[int] = []  # signals received inside signals_deferred(), in order
_deferring = False


def _hold(signum: int, frame) -> None:
    _held.append(signum)


def interrupt_once(signum: int, frame) -> None:
    """A signal handler for the CLI: the first SIGINT/SIGTERM/SIGHUP raises KeyboardInterrupt, so
    the gate unwinds and closes its engines; later ones raise nothing (they cannot abort that
    unwinding half-way) and only hurry it: the cleanups skip their grace periods."""
    for s in DEFERRED_SIGNALS:
        signal.signal(s, _hold)
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether a signal arrived during the current cleanup: waits for a graceful exit stop early."""
    return bool(_held)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Run a cleanup to its end: SIGINT/SIGTERM/SIGHUP arriving inside are held, then re-delivered
    (to the handlers in place before) once the block is done. Nested uses are one block; outside
    the main thread (where handlers cannot be set) it does nothing."""
    global _deferring
    if _deferring or threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in DEFERRED_SIGNALS}
    for s in DEFERRED_SIGNALS:
        signal.signal(s, _hold)
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if _held:
            first = _held[0]
            _held.clear()
            signal.raise_signal(first)  # e.g. KeyboardInterrupt under the CLI, once cleanup is done


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> None:
    """Wait up to timeout_s for proc to exit, less if a signal arrives meanwhile."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and not interrupted() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs.

    Zombies do not count: a dead member whose parent has not reaped it yet cannot hold a GPU
    or a port, and waiting for its reaper could take forever. The caller must reap the leader
    (proc.poll()) itself, or it stays a zombie. Without /proc (macOS) a zombie cannot be told
    from a live process, so killpg's answer is trusted.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:  # it exited between listdir and open
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def open_log(path: str | Path | None, prefix: str, header: str) -> tuple[BinaryIO, str, bool]:
    """Open the engine's log for appending and write a header line; returns (file, abs path, is_temp).

    path None (no run directory): a temp file named prefix...log, which is_temp tells the
    caller about. Appending keeps the log of an earlier start of the same engine.
    """
    is_temp = path is None
    if is_temp:
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
        os.close(fd)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "ab")  # noqa: SIM115 (the log outlives this call: close_log closes it)
    f.write(f"{header}\n".encode("utf-8", "replace"))
    f.flush()
    return f, os.path.abspath(path), is_temp


def close_log(f) -> None:
    """Close a log file (None: nothing); a failing close must not hide the error being reported."""
    if f is not None:
        try:
            f.close()
        except OSError:
            pass


def spawn(argv: Sequence[str], env: Mapping[str, object], cwd: str, **stdio) -> subprocess.Popen:
    """Start argv in a new session (so a new process group, pgid = its pid) with os.environ + env.

    A session of its own also keeps the child off the terminal: Ctrl-C reaches only the gate,
    which then stops the group itself, and a child touching the tty cannot be stopped by job
    control. stdio: Popen's stdin/stdout/stderr. OSError (not found, not executable) propagates.
    """
    full_env = dict(os.environ)
    full_env.update({k: str(v) for k, v in env.items()})
    with signals_deferred():  # no signal between the fork and the registration
        proc = subprocess.Popen(list(argv), cwd=cwd, env=full_env, start_new_session=True, **stdio)
        _live[proc.pid] = proc
    return proc


def _killpg(pgid: int, sig: int) -> bool:
    """Signal the group; False when it is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen, pgid: int, term_grace_s: float, kill_wait_s: float) -> None:
    """Stop the whole group: SIGTERM, term_grace_s to exit, then SIGKILL; reaps the leader.

    SIGKILL is repeated for up to kill_wait_s, until no member runs: one in uninterruptible
    sleep (a GPU driver call) dies only when it wakes, and the caller must not go on (free a
    port, start the next engine) while it holds its resources. The leader is polled all along
    so that it does not linger as a zombie (which killpg, without /proc, counts as alive).
    A signal arriving meanwhile ends the SIGTERM grace at once (someone wants out: SIGKILL
    now) and is re-delivered when the group is gone. Safe to call twice.
    """
    with signals_deferred():
        proc.poll()
        if group_alive(pgid) and _killpg(pgid, signal.SIGTERM):
            deadline = time.monotonic() + term_grace_s
            while time.monotonic() < deadline and not interrupted():
                proc.poll()
                if not group_alive(pgid):
                    break
                time.sleep(POLL_S)
            deadline = time.monotonic() + kill_wait_s
            while group_alive(pgid) and time.monotonic() < deadline:
                if not _killpg(pgid, signal.SIGKILL):
                    break
                time.sleep(POLL_S)
                proc.poll()
        try:
            proc.wait(timeout=kill_wait_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - only a leader stuck in the kernel
            pass
        _live.pop(pgid, None)


@atexit.register
def _stop_survivors() -> None:
    """The safety net at interpreter exit: stop every group that no close() stopped."""
    for pgid, proc in list(_live.items()):
        stop_group(proc, pgid, EXIT_TERM_GRACE_S, EXIT_KILL_WAIT_S)
