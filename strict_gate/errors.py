"""Errors a user can act on. Each carries the CLI exit code and says what to do next.

Exit codes (ExitCode): 0 pass, 1 fail, 2 bad input or config, 3 engine failure or incomplete run,
4 tokens pass but slower than the speed bar, 5 tokens pass but they move with batch, concurrency,
chunked prefill or the prefix cache (the invariance verdict).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What `strict-gate` exits with; the README's table says the same."""

    PASS = 0
    FAIL = 1
    BAD_INPUT = 2
    ENGINE_FAILURE = 3
    SLOWER = 4
    NOT_INVARIANT = 5


class StrictGateError(Exception):
    """Base class: message is shown to the user as is, never with a traceback."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class InputError(StrictGateError):
    """A prompt set, run directory or report that cannot be read as it is."""


class ConfigError(StrictGateError):
    """A gate or engine config that is invalid."""


class MissingExtraError(StrictGateError):
    """An engine needs a package that is not installed."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"this engine needs `{package}`, which is not installed; "
            f'install it with: pip install -e ".[{extra}]"'
        )


class EngineError(StrictGateError):
    """An engine failed while running (crash, hang, protocol violation)."""

    exit_code = 3


class IncompleteRunError(StrictGateError):
    """A run directory that was not finished (the writer died before closing it)."""

    exit_code = 3
