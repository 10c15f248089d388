"""The `strict-gate` command: thin typer functions over the library.

Exit codes: 0 pass, 1 fail, 2 bad input or config, 3 engine failure or incomplete run,
4 slower than the [speed] bar or not comparable (only when the token verdict passed).
Heavy engines are imported only by the commands that run them; --help and compare need no torch.
"""

from __future__ import annotations

import functools
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from strict_gate.errors import ExitCode, StrictGateError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Prove an inference engine emits exactly the tokens vLLM emits (greedy, token for token).",
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(markup=False, highlight=False)
err = Console(stderr=True, markup=False, highlight=False)

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "gates" / "demo.toml"

PolicyOpt = Annotated[
    str | None, typer.Option("--policy", help="strict | near-tie | distributional | auto (default: the config's)")
]
BandOpt = Annotated[float | None, typer.Option("--band", help="near-tie band in nats (default 0.5)")]
ForceOpt = Annotated[bool, typer.Option("--force", help="replace a complete run already at --out")]
SummaryOpt = Annotated[
    Path | None,
    typer.Option("--summary", metavar="FILE", help="write the markdown summary here ($GITHUB_STEP_SUMMARY is appended to when set)"),
]
FailOnOpt = Annotated[
    str | None,
    typer.Option("--fail-on", help="regressions that exit 1, comma-separated: new-failure, status-worse, "
                 "positions-drop, drift-worse, or none (default: the first three)"),
]


def _fail_cleanly(fn):
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
            _say_interrupted(e)
            raise typer.Exit(ExitCode.ENGINE_FAILURE) from None

    return wrapper


def _say_interrupted(e: KeyboardInterrupt) -> None:
    """Which runs were closed as failed and, for a gate, the command that continues it."""
    from strict_gate.errors import GateInterrupted
    from strict_gate.report.text import visible

    if not isinstance(e, GateInterrupted):
        err.print("interrupted: the run directories written so far are marked failed")
        return
    failed = ", ".join(visible(f) for f in e.failed) or "none (no arm had started)"
    err.print(f"interrupted: runs marked failed: {failed}", soft_wrap=True)
    err.print(f"continue with: strict-gate gate --resume {shlex.quote(visible(e.report_dir))}", soft_wrap=True)


def _progress():
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

        def on_record(record, seconds: float) -> None:
            state["tokens"] += len(record.token_ids)
            state["seconds"] += seconds
            tps = state["tokens"] / state["seconds"] if state["seconds"] > 0 else 0.0
            progress.update(task, advance=1, tps=f"{tps:7.1f} tok/s")

        return on_record

    return progress, hook


def _finish(result, report_dir: Path | None, exit_code: int | None = None) -> None:
    from strict_gate.report.console import print_result

    print_result(result, console, report_dir=str(report_dir) if report_dir else None)
    raise typer.Exit(result.exit_code if exit_code is None else exit_code)


def _summarise(result, summary: Path | None) -> None:
    """A gate's markdown summary to --summary FILE and to $GITHUB_STEP_SUMMARY when set."""
    if summary is not None or os.environ.get("GITHUB_STEP_SUMMARY"):
        from strict_gate.nightly.loop import summary_markdown, write_summary

        write_summary(summary_markdown(result), summary)


def _fail_on(text: str | None):
    from strict_gate.nightly.diff import DEFAULT_FAIL_ON, parse_fail_on

    return DEFAULT_FAIL_ON if text is None else parse_fail_on(text)


@app.command()
@_fail_cleanly
def gate(
    config: Annotated[Path | None, typer.Argument(help="gate TOML; default: the bundled demo gate")] = None,
    policy: PolicyOpt = None,
    band: BandOpt = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="where reports go")] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", metavar="REPORT_DIR", help="continue an interrupted gate, keeping the prompts done"),
    ] = None,
    summary: SummaryOpt = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="leave vLLM's and transformers' logs on the console, not in engine.log"),
    ] = False,
) -> None:
    """Run both arms per the config, compare them, and write the report."""
    from contextlib import nullcontext

    from strict_gate.core.engine_log import engine_logs_on_console

    with engine_logs_on_console() if verbose else nullcontext():
        _gate(config, policy, band, output_dir, resume, summary)


def _gate(config: Path | None, policy: str | None, band: float | None, output_dir: Path | None,
          resume: Path | None, summary: Path | None) -> None:
    if resume is not None:
        if config is not None or policy is not None or band is not None or output_dir is not None:
            raise StrictGateError("--resume runs the gate under its own REPORT_DIR/gate.toml: "
                                  "give no CONFIG, --policy, --band or -o with it")
        from strict_gate.gate.resume import resume_gate

        progress, hook = _progress()
        with progress:
            resumed = resume_gate(resume, progress=hook)
        err.print(resumed.describe())
        _summarise(resumed.outcome.result, summary)
        return _finish(resumed.outcome.result, resumed.outcome.report_dir, resumed.exit_code)
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import run_gate

    if config is None:
        if not DEMO_CONFIG.exists():
            raise StrictGateError("no CONFIG given and the bundled demo gate (gates/demo.toml) is not in this install")
        config = DEMO_CONFIG
        err.print(f"running the bundled demo gate: {config}")
    cfg = load_gate_config(config)
    progress, hook = _progress()
    with progress:
        outcome = run_gate(cfg, policy=policy, band=band, output_dir=output_dir, progress=hook)
    _summarise(outcome.result, summary)
    _finish(outcome.result, outcome.report_dir)


@app.command()
@_fail_cleanly
def bench(
    config: Annotated[Path, typer.Argument(help="gate TOML with a [speed] table")],
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="speed.json goes to DIR/<name>/")] = None,
) -> None:
    """Only the [speed] ladder: time both arms from outside, print it, write speed.json.
    Exit 0, 4 below min_speed_ratio or not comparable, 3 not measured while a bar is set, 2 bad input."""
    from strict_gate.core.engine_log import terminal_stderr
    from strict_gate.gate.bench import run_bench
    from strict_gate.gate.config import load_gate_config
    from strict_gate.report.console import print_speed
    from strict_gate.report.speed_view import build
    from strict_gate.report.text import visible

    cfg = load_gate_config(config)
    status = Console(file=terminal_stderr(), markup=False, highlight=False)  # not into an in-process engine.log
    outcome = run_bench(cfg, output_dir=output_dir, on_rung=lambda role, rung: status.print(f"{role}: rung {rung}"))
    print_speed(build(outcome.result.to_json(), cfg.speed_reference.kind), console)  # as the gate's reports word it
    console.print(f"wrote {visible(str(outcome.path))}")
    raise typer.Exit(outcome.result.verdict.exit_code)


@app.command()
@_fail_cleanly
def run(
    engine_config: Annotated[Path, typer.Argument(help="engine TOML (kind, options, [env]) or a gate config")],
    prompts: Annotated[Path, typer.Option("--prompts", "-p", help="prompt set .jsonl")],
    out: Annotated[Path, typer.Option("--out", help="run directory to write")],
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 16,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", min=0)] = 5,
    runs: Annotated[int, typer.Option("--runs", min=1, help="repeat each prompt K times (samples)")] = 1,
    force: ForceOpt = False,
) -> None:
    """Run one arm only, to record a run or a baseline."""
    from strict_gate.gate.arm import prompt_inputs, run_arm
    from strict_gate.gate.config import load_arm_config
    from strict_gate.report.text import visible
    from strict_gate.runs.output import staged_run_dir
    from strict_gate.runs.prompts import load_prompts
    from strict_gate.runs.records import Sampling

    arm = load_arm_config(engine_config)
    ps = load_prompts(prompts)
    progress, hook = _progress()
    with staged_run_dir(out, force=force) as staged:
        engine = arm.build()
        try:
            inputs = prompt_inputs(ps, engine)
            with progress:
                result = run_arm(
                    engine, inputs, Sampling(max_tokens, top_logprobs), staged,
                    prompt_set=ps, runs=max(runs, arm.runs), on_record=hook(arm.kind, len(inputs)), strict=True,
                )
        finally:
            engine.close()
    console.print(f"wrote {len(result.records)} records to {visible(str(out))}")


@app.command("check-engine")
@_fail_cleanly
def check_engine(
    engine_config: Annotated[Path, typer.Argument(help="engine TOML (kind, options, env) or a gate config")],
    arm: Annotated[str, typer.Option("--arm", help="of a gate config: candidate, reference or rescorer")] = "candidate",
    prompts: Annotated[
        Path | None, typer.Option("--prompts", "-p", help="take the first prompts of this set (default: built-in texts)")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="the dtype the engine computes in, when its hello does not say")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the checklist as JSON (for CI)")] = False,
) -> None:
    """Conformance checks of one engine: a checklist, exit 0 only when every applicable check passes
    (1 a check failed, 2 bad input, 3 the engine never started)."""
    import json

    from strict_gate.gate.check_engine import check_engine as run_checks
    from strict_gate.gate.check_engine import load_engine_arm
    from strict_gate.report.text import visible
    from strict_gate.runs.prompts import load_prompts

    cfg = load_engine_arm(engine_config, arm)
    checklist = run_checks(cfg, prompts=load_prompts(prompts) if prompts else None, dtype=dtype)
    if json_out:
        sys.stdout.write(json.dumps(checklist.to_json(), indent=2) + "\n")
    else:
        for line in checklist.lines():
            console.print(visible(line), soft_wrap=True)
    raise typer.Exit(checklist.exit_code)


@app.command()
@_fail_cleanly
def capture(
    config: Annotated[Path, typer.Argument(help="gate TOML whose [reference] is captured")],
    runs: Annotated[int | None, typer.Option("--runs", "-k", help="K runs per prompt (default: [reference] runs, else 5)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="default: baselines/<name>")] = None,
    force: ForceOpt = False,
) -> None:
    """Capture the reference K times (one prompt per call) into a baseline with its determinism."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import capture_baseline
    from strict_gate.report.text import visible
    from strict_gate.runs.output import safe_name

    cfg = load_gate_config(config, require_candidate=False)
    k = runs or (cfg.reference.runs if cfg.reference.runs > 1 else 5)
    if k < 1:
        raise StrictGateError("--runs must be >= 1")
    target = out or Path("baselines") / safe_name(cfg.name)
    progress, hook = _progress()
    with progress:
        result = capture_baseline(cfg, target, runs=k, progress=hook, force=force)
    det = result.manifest.determinism or {}
    console.print(
        f"baseline {visible(str(target))}: {len(result.records)} prompts, "
        f"{det.get('prompts_deterministic')}/{det.get('prompts_total')} deterministic over {k} runs"
    )
    for nd in det.get("non_deterministic", []):
        pos = ", ".join(str(p["position"]) for p in nd["positions"][:8])
        console.print(f"  {visible(nd['id'])}: {nd['distinct_sequences']} distinct sequences, differ at {pos}")


@app.command()
@_fail_cleanly
def compare(
    reference_run: Annotated[Path, typer.Argument(help="reference run directory")],
    candidate_run: Annotated[Path, typer.Argument(help="candidate run directory")],
    policy: Annotated[str, typer.Option("--policy")] = "auto",
    band: Annotated[float, typer.Option("--band")] = 0.5,
    out: Annotated[Path | None, typer.Option("--out", help="write reports to this directory")] = None,
    prompts: Annotated[
        Path | None, typer.Option("--prompts", "-p", help="the prompt set both runs were made from (expected ids)")
    ] = None,
) -> None:
    """Compare two stored runs: no engine, no torch."""
    from strict_gate.gate.run import compare_run_dirs

    result = compare_run_dirs(reference_run, candidate_run, policy=policy, band=band, prompts=prompts, out=out)
    _finish(result, out)


@app.command()
@_fail_cleanly
def diff(
    old_report: Annotated[Path, typer.Argument(help="last night's report directory or report.json")],
    new_report: Annotated[Path, typer.Argument(help="tonight's report directory or report.json")],
    fail_on: FailOnOpt = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write diff.json here (by default nothing is written)")
    ] = None,
) -> None:
    """What changed from one night's report to the next; exit 1 on a regression. No torch."""
    from strict_gate.nightly.diff import diff_report_files, render_markdown, write_diff_json

    d = diff_report_files(old_report, new_report, fail_on=_fail_on(fail_on))
    console.print(render_markdown(d))
    if json_out is not None:  # never by default: a report directory's diff.json is its nightly's
        write_diff_json(d, json_out)
    raise typer.Exit(d.exit_code)


@app.command()
@_fail_cleanly
def nightly(
    config: Annotated[Path, typer.Argument(help="gate TOML (its reference usually a committed baseline)")],
    previous: Annotated[
        Path | None,
        typer.Option("--previous", metavar="REPORT", help="last night's report (default: the newest in the output dir's history)"),
    ] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="kept from night to night")] = None,
    fail_on: FailOnOpt = None,
    keep: Annotated[int, typer.Option("--keep", help="report directories of this gate kept in the output dir")] = 14,
    summary: SummaryOpt = None,
) -> None:
    """Run a gate, diff it against the previous night, write the summary; exit 1 on a failed
    verdict or a regression, 3 on an incomplete gate."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.nightly.diff import render_markdown
    from strict_gate.nightly.loop import NO_PREVIOUS, run_nightly, write_summary
    from strict_gate.report.console import print_result

    cfg = load_gate_config(config)
    progress, hook = _progress()
    with progress:
        night = run_nightly(cfg, previous=previous, output_dir=output_dir, fail_on=_fail_on(fail_on), keep=keep,
                            progress=hook)
    print_result(night.gate.result, console, report_dir=str(night.gate.report_dir))
    console.print(render_markdown(night.diff) if night.diff else NO_PREVIOUS)
    write_summary(night.summary, summary)
    raise typer.Exit(night.exit_code)


@app.command()
@_fail_cleanly
def diagnose(
    report_dir: Annotated[Path, typer.Argument(help="a finished gate's report directory")],
) -> None:
    """Re-score a finished gate's divergences with its reference engine and rewrite the report."""
    from strict_gate.gate.rescore import rediagnose

    outcome = rediagnose(report_dir)
    _finish(outcome.result, outcome.report_dir)


@app.command()
@_fail_cleanly
def show(
    report_dir: Annotated[Path, typer.Argument(help="a finished gate's report directory")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="show this prompt (any status)")] = None,
) -> None:
    """Both continuations side by side in the terminal: tokens, top-k, gaps, diagnosis, text."""
    from strict_gate.report.show import show as show_report

    show_report(report_dir, prompt, console)


@app.command()
@_fail_cleanly
def prompts(file: Annotated[Path, typer.Argument(help="prompt set .jsonl")]) -> None:
    """Validate a prompt set and print its size and sha256."""
    from strict_gate.runs.prompts import load_prompts

    ps = load_prompts(file)
    n_text = sum(1 for p in ps.prompts if p.text is not None)
    console.print(f"{ps.name}: {len(ps)} prompts ({n_text} text, {len(ps) - n_text} token ids)")
    console.print(f"sha256 {ps.sha256}")


def main() -> None:  # pragma: no cover - console entry for `python -m strict_gate`
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
