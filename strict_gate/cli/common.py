"""What every command shares: the consoles, the option types, the demo config, and the wrapper
that turns a StrictGateError into its message and exit code."""

from __future__ import annotations

import functools
import os
import shlex
import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from strict_gate.core.shipped import ROOT
from strict_gate.errors import ExitCode, StrictGateError
from strict_gate.judge.policies import RULES

console = Console(markup=False, highlight=False)
err = Console(stderr=True, markup=False, highlight=False)

DEMO_CONFIG = ROOT / "gates" / "demo.toml"

POLICY_HELP = "; ".join(f"{n}: {r.doc}" for n, r in RULES.items()) + " (default: the config's)"
PolicyOpt = Annotated[str | None, typer.Option("--policy", help=POLICY_HELP)]
BandOpt = Annotated[float | None, typer.Option("--band", help="near-tie band in nats (default 0.5)")]
# A gate's band is its config's (gate/config.py: the `band` key, DEFAULT_BAND where the config sets
# none, or "measured" from its noise profile); tests/test_newcomer.py holds the 0.5 to DEFAULT_BAND.
GateBandOpt = Annotated[float | None, typer.Option(
    "--band", help="near-tie band in nats; default: the config's `band` key (0.5 where the config sets none; "
                   "\"measured\": its noise profile's, docs/noise.md)")]
ForceOpt = Annotated[bool, typer.Option("--force", help="replace a complete run already at --out")]
SummaryOpt = Annotated[
    Path | None,
    typer.Option("--summary", metavar="FILE", help="write the markdown summary here ($GITHUB_STEP_SUMMARY is appended to when set)"),
]
FailOnOpt = Annotated[
    str | None,
    typer.Option("--fail-on", help="regressions that exit 1, comma-separated: new-failure, status-worse, "
                 "positions-drop, drift-worse, variant-moved, or none (default: the first three)"),
]


def fail_cleanly(fn):
    """Turn a StrictGateError into its message and exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # SIGTERM (a CI timeout, a kill) and SIGHUP (the terminal closed) unwind like Ctrl-C:
        # runs are closed as failed and launched servers and engine processes are stopped by
        # the engines' close(). Only the first signal interrupts: later ones hurry the cleanup
        # (no grace periods) and cannot abort it half-way (engines/process.py).
        from strict_gate.engines.process import DEFERRED_SIGNALS, interrupt_once

        for sig in DEFERRED_SIGNALS:
            signal.signal(sig, interrupt_once)
        try:
            return fn(*args, **kwargs)
        except StrictGateError as e:
            from strict_gate.core.redact import scrub
            from strict_gate.report.text import visible

            message = visible(scrub(str(e)), keep_newlines=True)
            err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt as e:
            for sig in DEFERRED_SIGNALS:  # engines are stopped (or by the atexit net): a late signal must not kill us
                signal.signal(sig, signal.SIG_IGN)
            say_interrupted(e)
            raise typer.Exit(ExitCode.ENGINE_FAILURE) from None

    return wrapper


def say_interrupted(e: KeyboardInterrupt) -> None:
    """For a gate (or `strict-gate invariance`): where it stopped, which runs were closed as failed,
    what `--resume` will keep, continue and run again, and the command that continues it."""
    from strict_gate.errors import GateInterrupted
    from strict_gate.report.text import visible

    if not isinstance(e, GateInterrupted):
        err.print("interrupted: the run directories written so far are marked failed")
        return
    if e.where:
        err.print(f"interrupted: {visible(e.where)}", soft_wrap=True)
    failed = ", ".join(visible(f) for f in e.failed) or "none (no run was open)"
    err.print(f"runs marked failed: {failed}", soft_wrap=True)
    for line in e.plan:
        err.print(visible(line), soft_wrap=True)
    err.print(f"continue with: strict-gate {e.command} --resume {shlex.quote(visible(e.report_dir))}",
              soft_wrap=True)


def progress_bars():
    """A rich progress bar per arm: prompts done / total and generated tokens per second. It is
    drawn on the terminal itself, since an in-process arm points stdout and stderr at its engine.log."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from strict_gate.core.engine_log import terminal_stderr

    progress = Progress(
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tps]}"),
        TimeElapsedColumn(),
        console=Console(file=terminal_stderr(), markup=False, highlight=False),
        transient=False,
        redirect_stdout=False,  # an engine's prints belong in its engine.log, not above the bar
        redirect_stderr=False,
    )

    def hook(label: str, total: int):
        task = progress.add_task(label, total=total, tps="")
        state = {"tokens": 0, "seconds": 0.0}

        def on_record(record, seconds: float | None) -> None:
            if seconds is None:  # a replayed run: its wall clock is a file read, not a speed
                progress.update(task, advance=1, tps="replayed (no speed)")
                return
            state["tokens"] += len(record.token_ids)
            state["seconds"] += seconds
            tps = state["tokens"] / state["seconds"] if state["seconds"] > 0 else 0.0
            progress.update(task, advance=1, tps=f"{tps:7.1f} tok/s")

        return on_record

    return progress, hook


def finish(result, report_dir: Path | None, exit_code: int | None = None, next_step: str | None = None,
           dec=None) -> None:
    """The console summary, then `next_step` (the command to type next), then the exit code;
    `dec` is the gate's decoder (GateOutcome.decoder), so the console does not load it again."""
    from strict_gate.report.console import print_result
    from strict_gate.report.text import visible

    print_result(result, console, report_dir=str(report_dir) if report_dir else None, dec=dec)
    if next_step:
        console.print(f"  {visible(next_step)}", soft_wrap=True)  # one line: it is copied into a shell
    raise typer.Exit(result.exit_code if exit_code is None else exit_code)


def summarise(result, summary: Path | None, dec=None) -> None:
    """A gate's markdown summary to --summary FILE and to $GITHUB_STEP_SUMMARY when set."""
    if summary is not None or os.environ.get("GITHUB_STEP_SUMMARY"):
        from strict_gate.report.job_summary import summary_markdown, write_summary

        write_summary(summary_markdown(result, dec), summary)


def fail_on_rules(text: str | None):
    from strict_gate.nightly.diff import DEFAULT_FAIL_ON, parse_fail_on

    return DEFAULT_FAIL_ON if text is None else parse_fail_on(text)

