"""In-process engines' own output goes to the arm's engine.log, not the console.

vLLM and transformers log their start-up at INFO (vLLM about 70 lines, part of it from its
engine-core child process) and print warnings, all of which used to bury the gate's table.
While an arm of an engine that declares `log_libraries` runs, file descriptors 1 and 2 point
at `<run dir>/engine.log` (so child processes and C code follow), and those libraries' loggers
write there too; everything is restored after. `strict-gate gate -v` keeps them on the console.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from pathlib import Path

_ON_CONSOLE: ContextVar[bool] = ContextVar("engine_logs_on_console", default=False)


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


def engine_log(path: str | Path, libraries: tuple[str, ...]):
    """Route an in-process engine's output to `path` for the duration of the block; a no-op for
    engines that declare no libraries (servers and binaries log through their own log_path)."""
    if not libraries or _ON_CONSOLE.get():
        return nullcontext()
    return _to_file(Path(path), libraries)
