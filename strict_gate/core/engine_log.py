"""In-process engines' own output goes to the arm's engine.log, not the console.

vLLM and transformers log their start-up at INFO (vLLM about 70 lines, part of it from its
engine-core child process) and print warnings, all of which used to bury the gate's table.
While an arm of an engine that declares `log_libraries` runs, file descriptors 1 and 2 point
at `<run dir>/engine.log` (so child processes and C code follow), and those libraries' loggers
write there too; everything is restored after. `strict-gate gate -v` keeps them on the console.

An engine log is capped (`CappedLog`): what one engine start writes beyond LOG_HEAD_BYTES +
LOG_TAIL_BYTES is dropped from the middle, where a marker line says how many bytes went, so an
engine printing 100 MB cannot fill the report directory, and the start-up and the last words
before a failure both stay. Child processes' output is capped as it arrives
(engines/process.py pumps it through a pipe); an in-process arm's log is trimmed when it ends.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from pathlib import Path

_ON_CONSOLE: ContextVar[bool] = ContextVar("engine_logs_on_console", default=False)
LOG_HEAD_BYTES = 4 * 1024 * 1024  # kept from the start of what one engine start writes
LOG_TAIL_BYTES = 4 * 1024 * 1024  # kept from its end
LINE_SEARCH_BYTES = 64 * 1024  # the kept tail starts at a line when one begins this close to its start


class CappedLog:
    """A binary log file opened for appending ("a+b"), of which the bytes written through this
    object keep only their first `head` and last `tail` (what the file held before is kept as
    it is). Thread-safe: a pump thread and the engine's own notes write to it together."""

    def __init__(self, f, head: int = LOG_HEAD_BYTES, tail: int = LOG_TAIL_BYTES, start: int | None = None):
        self.file = f
        self.head, self.tail = head, tail
        self._start = os.fstat(f.fileno()).st_size if start is None else start
        self._lock = threading.Lock()
        self._dropped = 0  # engine bytes dropped so far
        self._marker = 0  # length of the marker line in the file

    def write(self, data: bytes) -> None:
        with self._lock:
            self.file.write(data)
            self.file.flush()
            if self._size() > self.head + 2 * self.tail + self._marker:  # trim in steps of `tail`
                self._trim()

    def flush(self) -> None:
        with self._lock:
            self.file.flush()

    def close(self) -> None:
        """Trim to head + marker + tail, then close."""
        with self._lock:
            try:
                self.file.flush()
                if self._size() > self.head + self.tail + self._marker:
                    self._trim()
            finally:
                self.file.close()

    def _size(self) -> int:
        return os.fstat(self.file.fileno()).st_size - self._start

    def _trim(self) -> None:
        fd = self.file.fileno()
        end = os.fstat(fd).st_size
        cut = self._start + self.head
        tail = os.pread(fd, self.tail, end - self.tail)
        newline = tail.find(b"\n", 0, LINE_SEARCH_BYTES)
        if newline >= 0:
            tail = tail[newline + 1 :]
        self._dropped += end - cut - self._marker - len(tail)
        marker = (f"\n--- strict-gate: {self._dropped} bytes of engine output dropped here (an engine log keeps "
                  f"the first {self.head} and the last {self.tail} bytes of each start) ---\n").encode()
        self.file.truncate(cut)
        self.file.write(marker + tail)
        self.file.flush()
        self._marker = len(marker)


def trim_log(path: str | Path, start: int) -> None:
    """Cap what was appended to `path` after byte `start` (an in-process arm's log, once it ended)."""
    try:
        f = open(path, "a+b")  # noqa: SIM115 (CappedLog.close closes it)
    except OSError:
        return
    try:
        CappedLog(f, start=start).close()
    except OSError:
        pass


@contextmanager
def engine_logs_on_console() -> Iterator[None]:
    """Leave engine output on the console (`-v`), e.g. to watch a slow start-up."""
    token = _ON_CONSOLE.set(True)
    try:
        yield
    finally:
        _ON_CONSOLE.reset(token)


def terminal_stderr():
    """A handle on the terminal that stays one while an arm's fd 2 points at its engine.log:
    the gate's progress is drawn there. Outside a real terminal (tests), sys.stderr itself."""
    try:
        if sys.stderr is not None and sys.stderr.fileno() == 2:
            return os.fdopen(os.dup(2), "w", encoding=sys.stderr.encoding or "utf-8", errors="replace",
                             buffering=1)
    except (AttributeError, OSError, ValueError):
        pass
    return sys.stderr


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


@contextmanager
def _to_file(path: Path, libraries: tuple[str, ...]) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in the finally below)
    start = os.fstat(log.fileno()).st_size
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved_loggers = []
    for name in libraries:
        logger = logging.getLogger(name)
        saved_loggers.append((logger, list(logger.handlers), logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False
    _flush()
    saved_fds = []
    for fd in (1, 2):
        try:
            saved_fds.append((fd, os.dup(fd)))
            os.dup2(log.fileno(), fd)
        except OSError:  # no such descriptor (a daemon): the loggers still go to the file
            pass
    try:
        yield
    finally:
        _flush()
        for fd, saved in saved_fds:
            os.dup2(saved, fd)
            os.close(saved)
        for logger, handlers, propagate in saved_loggers:
            if logger.handlers == [handler]:
                logger.handlers, logger.propagate = handlers, propagate
            elif handler in logger.handlers:  # the library configured itself meanwhile: keep its setup
                logger.removeHandler(handler)
        log.close()
        trim_log(path, start)


def engine_log(path: str | Path, libraries: tuple[str, ...]):
    """Route an in-process engine's output to `path` for the duration of the block; a no-op for
    engines that declare no libraries (servers and binaries log through their own log_path)."""
    if not libraries or _ON_CONSOLE.get():
        return nullcontext()
    return _to_file(Path(path), libraries)
