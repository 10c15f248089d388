"""The engine process behind a command engine: start, one request at a time, stop, and what a
failure says (protocol strict-gate/engine@1, docs/engine-protocol.md).

The process runs in its own process group, reads requests on stdin and writes protocol lines
on stdout; its stderr is appended to a log whose tail is quoted when it dies. Every failure
(bad JSON, wrong id, early exit, hang) is an EngineError and kills the whole group: no engine
process outlives close() or an error. What the replies may hold is command_replies.py's.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from strict_gate.core.engine_log import CappedLog
from strict_gate.core.redact import scrub
from strict_gate.engines.base import Serving
from strict_gate.engines.command.inflight import hello_servings
from strict_gate.engines.command.options import CommandOptions
from strict_gate.engines.process import (
    close_log,
    log_caught_up,
    open_log,
    signals_deferred,
    spawn,
    stop_group,
    wait_exit,
)
from strict_gate.errors import ConfigError, EngineError

PROTOCOL = "strict-gate/engine@1"
QUOTE_CHARS = 200  # how much of a bad line an error quotes
STDERR_TAIL_LINES = 20
MAX_BANNER_LINES = 1000  # non-JSON stdout lines tolerated before the hello (library banners)
SHUTDOWN_GRACE_S = 5.0  # after {"op": "shutdown"}: time to exit on its own
TERM_GRACE_S = 2.0  # after SIGTERM: time before SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL: time for the group to be gone (a member in uninterruptible sleep)

_EOF = object()


def _quote(line: str | bytes, n: int = QUOTE_CHARS) -> str:
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.rstrip("\r\n")
    return repr(line if len(line) <= n else line[:n] + f"... ({len(line)} chars)")


class EngineProcess:
    """The process half of CommandEngine: needs self.argv, env, cwd, base_dir, options
    (timeout_s, startup_timeout_s, log) and log_path; sets self.hello and self.can_score."""

    # What the subclass (CommandEngine, via Engine.__init__) sets before start():
    options: CommandOptions
    argv: list[str]
    env: dict[str, str]
    cwd: str
    base_dir: Path
    log_path: str | Path | None
    # What this half sets:
    hello: dict | None
    can_score: bool
    can_dump: bool
    can_graft: bool
    can_dump_decode: bool
    can_graft_ops: bool
    servings: frozenset[Serving]
    _proc: subprocess.Popen | None
    _pgid: int | None
    _lines: queue.Queue | None  # stdout lines (bytes), then _EOF
    _reader: threading.Thread | None
    _log_file: CappedLog | None
    _log_used: str | None

    # -- lifecycle
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self._cleanup()  # a previous process that died: reap it and its group first
        log = self.options.log
        if log is not None:
            log_path: str | Path | None = Path(log) if os.path.isabs(log) else self.base_dir / log
        else:
            log_path = self.log_path
        self._log_file, self._log_used, temp_log = open_log(
            log_path, "strict-gate-command-", scrub(f"--- strict-gate: starting {self.argv!r} in {self.cwd}")
        )
        try:
            # its own group: close() kills the binary and all it started
            self._proc = spawn(self.argv, self.env, self.cwd, orphan_grace_s=TERM_GRACE_S,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file)
        except OSError as e:
            close_log(self._log_file)
            self._log_file = None
            if temp_log:
                os.unlink(self._log_used)
            if isinstance(e, FileNotFoundError):
                why = f"{self.argv[0]!r}: not found (cwd {self.cwd})"
            elif isinstance(e, PermissionError):
                why = f"{self.argv[0]!r}: permission denied"
            else:
                why = f"{self.argv!r}: {e}"
            raise ConfigError(f"command: cannot run {why}") from None
        self._pgid = self._proc.pid
        self.answered_ids: set[str] = set()  # a new process: no reply had yet
        self._lines = queue.Queue()
        self._reader = threading.Thread(
            target=self._read_stdout, args=(self._proc.stdout, self._lines), daemon=True, name="strict-gate-command"
        )
        self._reader.start()
        try:
            self._read_hello()
        except BaseException:
            self._kill()
            raise

    @staticmethod
    def _read_stdout(stream, lines: queue.Queue) -> None:
        try:
            for raw in iter(stream.readline, b""):
                lines.put(raw)
        except (OSError, ValueError):
            pass
        finally:
            lines.put(_EOF)

    def _read_hello(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        for _ in range(MAX_BANNER_LINES + 1):
            raw = self._next_line(deadline, what="its hello line", timeout_name="startup_timeout_s",
                                  timeout=self.options.startup_timeout_s)
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                # Libraries print banners on stdout at load; keep them in the log, wait for the hello.
                self._log_note(f"stdout before hello: {raw.decode('utf-8', 'replace').rstrip()}")
                continue
            if not isinstance(obj, dict) or "hello" not in obj:
                raise self._fail(f"its first JSON line must be the hello, got {_quote(raw)}")
            break
        else:
            raise self._fail(f"no hello line within its first {MAX_BANNER_LINES} stdout lines")
        if obj["hello"] != PROTOCOL:
            raise self._fail(f'its hello speaks {obj["hello"]!r}; this gate speaks {PROTOCOL!r}')
        caps = obj.get("capabilities", ["generate"])
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise self._fail(f'hello "capabilities" must be a list of strings, got {caps!r}')
        if "generate" not in caps:
            raise self._fail(f'hello "capabilities" {caps!r} lacks "generate"')
        for key in ("name", "version", "model"):
            if key in obj and obj[key] is not None and not isinstance(obj[key], str):
                raise self._fail(f'hello "{key}" must be a string, got {obj[key]!r}')
        ctx = obj.get("max_context")
        if ctx is not None and (not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 1):
            raise self._fail(f'hello "max_context" must be a positive integer (tokens), got {ctx!r}')
        if "versions" in obj and not isinstance(obj["versions"], dict):
            raise self._fail(f'hello "versions" must be an object, got {obj["versions"]!r}')
        try:
            self.max_in_flight, self.servings = hello_servings(obj)
        except ValueError as e:
            raise self._fail(str(e)) from None
        self.hello = obj
        self.can_score = "score" in caps  # instance attribute shadows the class default
        self.streams = "stream" in caps  # token events for the speed arm (command_speed.py)
        self.can_dump = "dump" in caps  # activations for strict_gate/localize
        self.can_graft = self.can_dump and "graft" in caps
        self.can_dump_decode = self.can_dump and "dump_decode" in caps  # DumpRequest.decode_from
        self.can_graft_ops = self.can_graft and "graft_ops" in caps  # op points in DumpRequest.graft

    def close(self) -> None:
        """Ask for a shutdown, give it a few seconds, then SIGTERM and SIGKILL the group.

        A signal arriving meanwhile cuts the waits short and is re-delivered afterwards: the
        group is gone whatever happens."""
        if self._proc is None:
            return
        with signals_deferred():
            if self._proc.poll() is None:
                try:
                    self._write({"op": "shutdown"}, time.monotonic() + 1.0)
                except (TimeoutError, OSError):
                    pass
                assert self._proc.stdin is not None  # spawned with stdin=PIPE
                try:
                    self._proc.stdin.close()
                except OSError:
                    pass
                wait_exit(self._proc, SHUTDOWN_GRACE_S)
            self._kill()

    def _kill(self) -> None:
        """Terminate the whole process group (SIGTERM, then SIGKILL) and release pipes and log."""
        proc, pgid = self._proc, self._pgid
        if proc is None:
            return
        assert pgid is not None  # set with _proc
        stop_group(proc, pgid, TERM_GRACE_S, KILL_WAIT_S)
        # The group is gone, so stdout is at EOF and the reader ends. Close stdout only after
        # it has: closing a buffered stream under a blocked reader could wait on its lock.
        reader_done = True
        if self._reader is not None:
            self._reader.join(timeout=2)
            reader_done = not self._reader.is_alive()
        for stream in (proc.stdin, proc.stdout if reader_done else None):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):
                pass
        self._proc = None
        self._pgid = None
        self._reader = None
        self._lines = None
        close_log(self._log_file)
        self._log_file = None

    def _cleanup(self) -> None:
        if self._proc is not None:
            self._kill()

    def _log_note(self, text: str) -> None:
        if self._log_file is not None:
            try:
                self._log_file.write(f"--- strict-gate: {text}\n".encode("utf-8", "replace"))
                self._log_file.flush()
            except (OSError, ValueError):
                pass

    # -- line I/O
    def _write(self, obj: dict, deadline: float) -> None:
        """Write one request line; a child that stops reading stdin cannot block us past deadline."""
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        assert self._proc is not None and self._proc.stdin is not None  # callers check running
        fd = self._proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            _, writable, _ = select.select([], [fd], [], remaining)
            if not writable:
                continue
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                continue
            view = view[n:]

    def _next_line(self, deadline: float, *, what: str, timeout_name: str, timeout: float) -> bytes:
        """The next non-blank stdout line, or an EngineError for a hang or an exit."""
        assert self._lines is not None  # set by start()
        while True:
            try:
                item = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self._fail(
                    f"no answer within {timeout_name} = {timeout:g} s while waiting for {what} (engine hung?)", tail=5
                ) from None
            if item is _EOF:
                raise self._exited(f"while we waited for {what}")
            if item.strip():
                return item

    # -- failure reporting
    def _stderr_tail(self, n: int = STDERR_TAIL_LINES) -> str:
        log_caught_up(self._pgid)
        if self._log_file is not None:
            try:
                self._log_file.flush()
            except (OSError, ValueError):
                pass
        if not self._log_used:
            return ""
        try:
            with open(self._log_used, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if not ln.startswith("--- strict-gate: ")]
        return "\n".join(lines[-n:])

    def _describe_exit(self) -> str:
        proc = self._proc
        assert proc is not None  # only a started process has exited
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "closed its stdout but is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with code {code}"

    def _exited(self, when: str) -> EngineError:
        how = self._describe_exit()
        tail = self._stderr_tail()
        msg = f"command engine {self._name()} {how} {when}"
        if tail:
            msg += f"; last lines of its stderr ({self._log_used}):\n" + tail
        else:
            msg += f"; its stderr log ({self._log_used}) is empty"
        self._kill()
        return EngineError(msg)

    def _fail(self, msg: str, *, tail: int = 0) -> EngineError:
        """An EngineError for a protocol violation or hang; the process group is killed first."""
        log = self._log_used
        text = self._stderr_tail(tail) if tail else ""
        self._kill()
        msg = f"command engine {self._name()}: {msg} (stderr log: {log})"
        if text:
            msg += "; last lines of its stderr:\n" + text
        return EngineError(msg)

    def _name(self) -> str:
        if self.hello and self.hello.get("name"):
            return repr(self.hello["name"])
        return repr(os.path.basename(self.argv[0]))

    # -- one request, one response
    def _request(self, req: dict, label: str, on_event=None) -> dict:
        """Send req, read its response object; any failure kills the engine and raises."""
        if not self.running:
            if self._proc is not None:
                raise self._exited(f"before {label} was sent")
            raise EngineError(f"command engine is not started ({label})")
        deadline = time.monotonic() + self.options.timeout_s
        try:
            try:
                self._write(req, deadline)
            except TimeoutError:
                raise self._fail(f"{label}: it did not read its stdin within timeout_s = {self.options.timeout_s:g} s") from None
            except (BrokenPipeError, ConnectionResetError):
                raise self._exited(f"before {label} was sent (stdin closed)") from None
            while True:  # streamed token events (command_speed.py) come before the response
                raw = self._next_line(deadline, what=f"the response to {label}", timeout_name="timeout_s",
                                      timeout=self.options.timeout_s)
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
                    raise self._fail(f"{label}: malformed JSON line ({why}): {_quote(raw)}") from None
                if not isinstance(obj, dict):
                    raise self._fail(f"{label}: the response must be a JSON object, got {_quote(raw)}")
                if on_event is None or "event" not in obj:
                    break
                why = on_event(obj)
                if why:
                    raise self._fail(f"{label}: {why}: {_quote(raw)}")
            if obj.get("id") != req["id"]:
                raise self._fail(
                    f"{label}: response carries id {obj.get('id')!r}, expected {req['id']!r} "
                    "(one request at a time, answered in order)"
                )
            return obj
        except EngineError:
            raise
        except BaseException:  # Ctrl-C or an internal error mid-request: the stream is out of step
            self._kill()
            raise

    def _invalid(self, label: str, why: str, obj: dict) -> EngineError:
        return self._fail(f"{label}: invalid response: {why}; response: {_quote(json.dumps(obj))}")

    # -- raw access for `strict-gate check-engine` (strict_gate/check_engine): what a gate never sends
    def exchange(self, req: dict, label: str, on_event: Callable[[dict], str | None] | None = None) -> dict:
        """Send `req` as it is (an op the gate never sends, a request no gate would write, a
        streamed generate whose events the caller records) and return the response object, with
        the framing and failure handling of every other request."""
        self.start()
        return self._request(req, label, on_event)

    def end_of_input(self, wait_s: float) -> tuple[int | None, str]:
        """Close stdin without a shutdown request, as a gate that died does, and wait up to wait_s
        for the exit: (exit code, None while still running; what it wrote on stderr after the
        EOF). The group is stopped either way."""
        self.start()
        log = Path(self._log_used) if self._log_used else None
        offset = log.stat().st_size if log is not None else 0
        assert self._proc is not None  # start() raises or leaves it running
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass
        wait_exit(self._proc, wait_s)
        code = self._proc.poll()
        self._kill()
        if log is None:
            return code, ""
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
        return code, "\n".join(ln for ln in text.splitlines() if not ln.startswith("--- strict-gate: "))
