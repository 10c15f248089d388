"""Child processes of the out-of-process engines (command, openai): launch, log, stop.

An engine process runs in a process group of its own so that stopping it also stops
everything it started (vLLM's engine-core and workers, a binary's helpers): the group is
what we signal and what we wait for. Its output goes through a pipe into a capped log file
(core/engine_log.py: the first and last few MiB of each start), whose tail the engines quote
when it dies; the pump scrubs known secrets from it line by line as it copies (core/redact.py),
so a gate killed before its last pass over the report directory leaves none in an engine.log.

No engine process may outlive the gate, whatever signal arrives when. Hence:
- a cleanup (stop_group, an engine's close()) runs inside `signals_deferred()`: a Ctrl-C or
  SIGTERM arriving then does not abort it half-way (which would leave the group running, as
  it lives in a session of its own and never sees the terminal's signals); it cuts the grace
  periods short instead (`interrupted()`), and is re-delivered once the group is gone;
- under the CLI (`interrupt_once`) only the first signal interrupts; later ones hurry the
  cleanup under way instead of aborting it;
- every group spawned here is registered until it is stopped, and an atexit handler stops
  whatever is left (an engine never closed, a spawn interrupted before its engine saw it);
- a gate that dies without unwinding (SIGKILL, the OOM killer) runs no cleanup at all: each
  group has a watchdog, a tiny process that notices the gate is gone (its parent changes) and
  stops the group, SIGTERM then SIGKILL. A parent-death signal (prctl) would reach only the
  group's leader, and fires when the thread that forked exits, not the gate;
- a helper that leaves the group (its own session: setsid) is still the engine's: every process
  spawned here carries a tag in its environment that its descendants inherit, and the stop and
  the watchdog signal the tagged processes beside the group (engines/descendants.py, with what
  a tag cannot find).
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from strict_gate.core.engine_log import CappedLog
from strict_gate.core.redact import scrub_bytes
from strict_gate.engines.descendants import TAG_VAR, WATCHDOG, marker, new_tag, signal_tagged, tagged

POLL_S = 0.05  # how often stop_group looks at the group
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_TERM_GRACE_S = 2.0  # the atexit net: SIGTERM grace before SIGKILL
EXIT_KILL_WAIT_S = 5.0
PUMP_POLL_S = 0.1  # how often a log pump looks for an end
PUMP_DRAIN_S = 2.0  # after its group is gone: time to copy what is left in the pipe
PUMP_LINE_BYTES = 64 * 1024  # an unfinished line held back this long at most (scrubbed whole, then written)

_live: dict[int, subprocess.Popen] = {}  # pgid -> leader of every group spawned and not yet stopped
_watchdogs: dict[int, subprocess.Popen] = {}  # pgid -> its watchdog
_tags: dict[int, str] = {}  # pgid -> the tag in its processes' environment (engines/descendants.py)
_pumps: dict[int, list[LogPump]] = {}  # pgid -> the pumps copying its output into logs
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


def open_log(path: str | Path | None, prefix: str, header: str) -> tuple[CappedLog, str, bool]:
    """Open the engine's log for appending and write a header line; returns (log, abs path, is_temp).

    path None (no run directory): a temp file named prefix...log, which is_temp tells the
    caller about. Appending keeps the log of an earlier start of the same engine.
    """
    is_temp = path is None
    if is_temp:
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
        os.close(fd)
    assert path is not None  # given, or the temp file's
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = CappedLog(open(path, "a+b"))  # noqa: SIM115 (the log outlives this call: close_log closes it)
    log.write(f"{header}\n".encode("utf-8", "replace"))
    return log, os.path.abspath(path), is_temp


def close_log(log: CappedLog | None) -> None:
    """Close a log (None: nothing); a failing close must not hide the error being reported."""
    if log is not None:
        try:
            log.close()
        except OSError:
            pass


class LogPump(threading.Thread):
    """Copies a child's output from a pipe into its CappedLog, until the pipe ends or stop()."""

    def __init__(self, fd: int, log: CappedLog):
        super().__init__(daemon=True, name="strict-gate-log")
        self.fd = fd
        self.log = log
        self._stopping = threading.Event()
        self._idle = threading.Event()  # set whenever the pipe was found empty (or at its end)

    def run(self) -> None:
        drain_until = None
        held = b""  # the unfinished last line: a secret a read cut in two is scrubbed whole
        try:
            while True:
                if self._stopping.is_set() and drain_until is None:
                    drain_until = time.monotonic() + PUMP_DRAIN_S
                if drain_until is not None and time.monotonic() > drain_until:
                    break  # a grandchild outside the group still writes: stop copying
                ready, _, _ = select.select([self.fd], [], [], 0 if drain_until else PUMP_POLL_S)
                if not ready:
                    held = self._write(held, whole=True)  # the pipe went quiet: its last words count
                    self._idle.set()
                    if drain_until is not None:
                        break
                    continue
                data = os.read(self.fd, 65536)
                if not data:
                    break
                held = self._write(held + data, whole=len(held) + len(data) > PUMP_LINE_BYTES)
        finally:
            self._write(held, whole=True)
            self._idle.set()
            os.close(self.fd)

    def _write(self, data: bytes, *, whole: bool) -> bytes:
        """Copy data's finished lines (all of it when `whole`), scrubbed; return what is held."""
        cut = len(data) if whole else data.rfind(b"\n") + 1
        if cut:
            try:
                self.log.write(scrub_bytes(data[:cut]))
            except (OSError, ValueError):  # disk full, log closed: keep the pipe flowing
                pass
        return data[cut:]

    def caught_up(self, timeout: float = 1.0) -> None:
        """Wait (up to timeout) until what the child wrote so far is in the log."""
        if self.is_alive():
            self._idle.clear()
            self._idle.wait(timeout)

    def stop(self) -> None:
        self._stopping.set()
        self.join(PUMP_DRAIN_S + 1.0)


def log_caught_up(pgid: int | None) -> None:
    """Before quoting a log's tail: let the group's pumps copy what is still in the pipes."""
    for pump in _pumps.get(pgid, []) if pgid is not None else []:
        pump.caught_up()


def spawn(argv: Sequence[str], env: Mapping[str, object], cwd: str, *, orphan_grace_s: float = EXIT_TERM_GRACE_S,
          **stdio) -> subprocess.Popen:
    """Start argv in a new session (so a new process group, pgid = its pid) with os.environ + env,
    and its watchdog (orphan_grace_s: its SIGTERM grace if the gate dies).

    A session of its own also keeps the child off the terminal: Ctrl-C reaches only the gate,
    which then stops the group itself, and a child touching the tty cannot be stopped by job
    control. stdio: Popen's stdin/stdout/stderr, where a CappedLog means "through a pipe into
    that log". OSError (not found, not executable) propagates.
    """
    full_env = dict(os.environ)
    full_env.update({k: str(v) for k, v in env.items()})
    tag = full_env[TAG_VAR] = new_tag()  # after env: an engine's own setting cannot hide its helpers
    pipes: list[tuple[int, CappedLog]] = []  # (read end, its log)
    ends: list[int] = []  # the write ends, the child's
    for name in ("stdout", "stderr"):
        log = stdio.get(name)
        if isinstance(log, CappedLog):
            if name == "stderr" and stdio.get("stdout") is log:
                stdio["stderr"] = subprocess.STDOUT
                continue
            r, w = os.pipe()
            pipes.append((r, log))
            ends.append(w)
            stdio[name] = w
    with signals_deferred():  # no signal between the fork and the registration
        try:
            proc = subprocess.Popen(list(argv), cwd=cwd, env=full_env, start_new_session=True, **stdio)
        except BaseException:
            for r, _ in pipes:
                os.close(r)
            raise
        finally:
            for w in ends:
                os.close(w)
        _live[proc.pid] = proc
        _tags[proc.pid] = tag
        _pumps[proc.pid] = [LogPump(r, log) for r, log in pipes]
        for pump in _pumps[proc.pid]:
            pump.start()
        _watchdogs[proc.pid] = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHDOG, str(os.getpid()), str(proc.pid), str(orphan_grace_s), marker(tag)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
    return proc


def _signal(pgid: int, tag: str | None, sig: int) -> bool:
    """Signal the group and every process carrying its tag; False when none is left."""
    try:
        os.killpg(pgid, sig)
        found = True
    except ProcessLookupError:
        found = False
    return (tag is not None and signal_tagged(tag, sig)) or found


def _alive(pgid: int, tag: str | None) -> bool:
    """Whether a member of the group, or a process it started elsewhere (its tag), still runs."""
    return group_alive(pgid) or (tag is not None and bool(tagged(tag)))


def stop_group(proc: subprocess.Popen, pgid: int, term_grace_s: float, kill_wait_s: float) -> None:
    """Stop the whole group and every process it started outside it (their tag): SIGTERM,
    term_grace_s to exit, then SIGKILL; reaps the leader.

    SIGKILL is repeated for up to kill_wait_s, until no member runs: one in uninterruptible
    sleep (a GPU driver call) dies only when it wakes, and the caller must not go on (free a
    port, start the next engine) while it holds its resources. The leader is polled all along
    so that it does not linger as a zombie (which killpg, without /proc, counts as alive).
    A signal arriving meanwhile ends the SIGTERM grace at once (someone wants out: SIGKILL
    now) and is re-delivered when the group is gone. Safe to call twice.
    """
    tag = _tags.get(pgid)
    with signals_deferred():
        proc.poll()
        if _alive(pgid, tag) and _signal(pgid, tag, signal.SIGTERM):
            deadline = time.monotonic() + term_grace_s
            while time.monotonic() < deadline and not interrupted():
                proc.poll()
                if not _alive(pgid, tag):
                    break
                time.sleep(POLL_S)
            deadline = time.monotonic() + kill_wait_s
            while _alive(pgid, tag) and time.monotonic() < deadline:
                if not _signal(pgid, tag, signal.SIGKILL):
                    break
                time.sleep(POLL_S)
                proc.poll()
        try:
            proc.wait(timeout=kill_wait_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - only a leader stuck in the kernel
            pass
        _live.pop(pgid, None)
        _tags.pop(pgid, None)
        for pump in _pumps.pop(pgid, []):
            pump.stop()
        watchdog = _watchdogs.pop(pgid, None)
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()


@atexit.register
def _stop_survivors() -> None:
    """The safety net at interpreter exit: stop every group that no close() stopped."""
    for pgid, proc in list(_live.items()):
        stop_group(proc, pgid, EXIT_TERM_GRACE_S, EXIT_KILL_WAIT_S)
