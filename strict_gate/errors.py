"""Errors a user can act on. Each carries the CLI exit code and says what to do next."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code the CLI gives (docs/reading-a-report.md, "Exit codes and their precedence");
    a caller branches on these values."""

    PASS = 0  # every prompt passes the policy
    FAIL = 1  # a prompt fails the policy, a speed arm's timed tokens do not verify, or the nightly diff found a regression
    BAD_INPUT = 2  # bad input or config: the message names the file (and line)
    ENGINE_FAILURE = 3  # an engine failed, the run is incomplete, or a speed ratio is not separable (never a pass)
    SLOWER = 4  # the tokens pass, the candidate is below `min_speed_ratio` (or not comparable)
    NOT_INVARIANT = 5  # the tokens pass, they move with batch, concurrency, chunked prefill or the prefix cache
    REFERENCE_OFF_GOLDEN = 6  # the tokens fail, and at every failing prompt the golden sides with the candidate ([golden] blame = true)


class StrictGateError(Exception):
    """Base class: message is shown to the user as is, never with a traceback."""

    exit_code = ExitCode.BAD_INPUT

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


def located(error: ConfigError, path: str | None, line: int | None) -> ConfigError:
    """`error` placed at `path`:`line` where it names no file: an engine's own refusal raised after
    its config was read (a tokenizer it lacks) is named at the table that configured it."""
    if error.path is not None or path is None:
        return error
    return ConfigError(str(error), path=path, line=line)


class MissingExtraError(StrictGateError):
    """An engine needs a package that is not installed."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"this engine needs `{package}`, which is not installed; "
            f'install it with: pip install -e ".[{extra}]"'
        )


class EngineError(StrictGateError):
    """An engine failed while running (crash, hang, protocol violation)."""

    exit_code = ExitCode.ENGINE_FAILURE


class IncompleteRunError(StrictGateError):
    """A run directory that was not finished (the writer died before closing it)."""

    exit_code = ExitCode.ENGINE_FAILURE


class GateInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, SIGHUP) during a gate (or `strict-gate invariance`), after its runs
    were closed: where it stopped (`where`: the phase, the run and its records), the runs marked
    failed, what `--resume` will keep, continue and run again (`plan`, one line each) and the
    command that continues it."""

    def __init__(self, report_dir: str, failed: tuple[str, ...], where: str = "", plan: tuple[str, ...] = (),
                 command: str = "gate"):
        super().__init__(report_dir)
        self.report_dir = report_dir
        self.failed = failed
        self.where = where
        self.plan = plan
        self.command = command
