"""The one owner of a gate's engine lifetimes.

A gate holds up to four engines (the two arms, a [rescorer], the speed arm's stand-in for a
stored reference) and stops each at the phase that no longer needs it, so that one engine is
loaded at a time; whatever happens (an engine failure, Ctrl-C), every engine the gate owns
and has not stopped yet is stopped on the way out, and the report directory is scrubbed
after (engine logs too: a server may log its key). Engines a caller handed in are theirs.
"""

from __future__ import annotations

from contextlib import ExitStack
from types import TracebackType

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import scrub_tree
from strict_gate.engines.base import Engine
from strict_gate.runs.layout import ReportDir


class Lifetimes:
    """Closes each owned engine once per start, into its run directory's engine.log (what it
    logs on the way out, vLLM's shutdown, belongs there)."""

    __slots__ = ("_open", "_report", "_roles", "_stack")

    def __init__(self, report: ReportDir):
        self._report = report
        self._roles: dict[int, str] = {}  # id of an owned engine -> the role whose engine.log it logs to
        self._open: set[int] = set()  # owned engines not closed since they were last (re)opened
        self._stack = ExitStack()
        self._stack.callback(scrub_tree, report.path)  # the first callback: it runs last

    def own(self, role: str, *engines: Engine) -> None:
        """The gate closes these: at close(), or on the way out."""
        for engine in engines:
            self._roles[id(engine)] = role
            self.reopen(engine)

    def reopen(self, engine: Engine) -> None:
        """An owned engine that close() stopped is to be started again (the drift pass restarts
        the candidate): it is closed again after. Engines the gate does not own are left alone."""
        if id(engine) in self._roles and id(engine) not in self._open:
            self._open.add(id(engine))
            self._stack.callback(self.close, engine)

    def close(self, *engines: Engine) -> None:
        """Stop these now, those of them the gate owns and has not stopped already."""
        for engine in engines:
            if id(engine) in self._open:
                self._open.discard(id(engine))
                with engine_log(self._report.arm(self._roles[id(engine)]).engine_log, engine.log_libraries):
                    engine.close()

    def __enter__(self) -> Lifetimes:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.__exit__(exc_type, exc, tb)  # every callback runs, whichever raises
