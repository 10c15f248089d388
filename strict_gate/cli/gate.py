"""Commands that run a gate or one of its phases: gate, bench, invariance, noise, golden, diagnose, localize."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from strict_gate.cli.common import (
    DEMO_CONFIG,
    GateBandOpt,
    PolicyOpt,
    SummaryOpt,
    console,
    err,
    fail_cleanly,
    finish,
    progress_bars,
    summarise,
)
from strict_gate.errors import StrictGateError


@fail_cleanly
def gate(
    config: Annotated[Path | None, typer.Argument(help="gate TOML; default: the bundled demo gate")] = None,
    policy: PolicyOpt = None,
    band: GateBandOpt = None,
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

        progress, hook = progress_bars()
        with progress:
            resumed = resume_gate(resume, progress=hook)
        err.print(resumed.describe())
        summarise(resumed.outcome.result, summary, resumed.outcome.decoder)
        return finish(resumed.outcome.result, resumed.outcome.report_dir, resumed.exit_code, dec=resumed.outcome.decoder)
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import run_gate
    from strict_gate.localize.next_step import next_step

    if config is None:
        if not DEMO_CONFIG.exists():
            raise StrictGateError("no CONFIG given and the bundled demo gate (gates/demo.toml) is not in this install")
        config = DEMO_CONFIG
        err.print(f"running the bundled demo gate: {config}")
    cfg = load_gate_config(config)
    progress, hook = progress_bars()
    with progress:
        outcome = run_gate(cfg, policy=policy, band=band, output_dir=output_dir, progress=hook)
    summarise(outcome.result, summary, outcome.decoder)
    finish(outcome.result, outcome.report_dir, next_step=next_step(cfg, outcome.result, outcome.report_dir),
           dec=outcome.decoder)


@fail_cleanly
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
    from strict_gate.gate.config import load_gate_config
    from strict_gate.report.text import visible
    from strict_gate.speed.bench import run_bench
    from strict_gate.speed.render import print_speed
    from strict_gate.speed.view import build

    cfg = load_gate_config(config)
    status = Console(file=terminal_stderr(), markup=False, highlight=False)  # not into an in-process engine.log
    outcome = run_bench(cfg, output_dir=output_dir, interleave=interleave,
                        on_rung=lambda role, rung: status.print(f"{role}: rung {rung}"))
    view = build(outcome.result.to_json(), cfg.speed_reference.kind)
    assert view is not None  # a bench result is its speed
    print_speed(view, console)  # as the gate's reports word it
    console.print(f"wrote {visible(str(outcome.path))}")
    raise typer.Exit(outcome.result.verdict.exit_code)


@fail_cleanly
def invariance(
    config: Annotated[Path | None, typer.Argument(help="gate TOML with an [invariance] table")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="where reports go")] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", metavar="REPORT_DIR", help="continue an interrupted `strict-gate invariance`, keeping the runs "
                                               "it finished")] = None,
) -> None:
    """Only the [invariance] variants: each arm's batch-1 run, then batches, requests in flight,
    prefill chunks, the prefix cache, needles. Exit 0, 5 a variant moved (policy strict or
    near-tie), 3 a variant not run (strict or near-tie), 2 bad input."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.invariance.phase import resume_invariance_gate, run_invariance_gate
    from strict_gate.invariance.render import print_invariance
    from strict_gate.report.text import visible

    if (config is None) == (resume is None):
        raise StrictGateError("give a CONFIG, or --resume REPORT_DIR (which runs under its own gate.toml), not both")
    if resume is not None and output_dir is not None:
        raise StrictGateError("--resume writes into REPORT_DIR: give no -o with it")
    progress, hook = progress_bars()
    with progress:
        if resume is not None:
            outcome = resume_invariance_gate(resume, progress=hook)
        else:
            assert config is not None
            outcome = run_invariance_gate(load_gate_config(config), output_dir=output_dir, progress=hook)
    if outcome.finished_already:
        err.print(f"nothing to resume: {visible(str(outcome.report_dir))} had finished; its reports are left as "
                  "they were")
    print_invariance(outcome.result, console)
    console.print(f"  report: {visible(str(outcome.report_dir))}/invariance.md")
    raise typer.Exit(int(outcome.result.exit_code))


@fail_cleanly
def golden(
    config: Annotated[Path, typer.Argument(help="gate TOML with a [golden] table: its [reference] is checked")],
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="where the report directory goes")] = None,
) -> None:
    """Check the reference on its own against the [golden] (docs/golden.md): its greedy tokens
    teacher-forced through the golden, sealed into golden.json. Exit 0, 1 the reference is off
    the golden's argmax by more than the band, 2 bad input, 3 the golden could not score."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.golden.command import check_lines, golden_check
    from strict_gate.report.text import visible

    progress, hook = progress_bars()
    with progress:
        outcome = golden_check(load_gate_config(config, require_candidate=False), output_dir=output_dir,
                               progress=hook)
    for line in check_lines(outcome.health, outcome.golden):
        console.print(visible(line), soft_wrap=True)
    console.print(f"  check: {visible(str(outcome.report_dir / 'golden.json'))}")
    raise typer.Exit(int(outcome.health.exit_code))


@fail_cleanly
def noise(
    config: Annotated[Path | None, typer.Argument(help="capture config or gate TOML: its [reference] is "
                                                       "profiled")] = None,
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
    resume: Annotated[Path | None, typer.Option(
        "--resume", metavar="REPORT_DIR", help="continue an interrupted `strict-gate noise`, keeping the runs it "
                                               "finished")] = None,
) -> None:
    """Measure the reference against itself (K runs, batch, prefill/decode, chunks, a second build)
    into a sealed noise profile (docs/noise.md). Exit 0, 2 bad input, 3 an engine failed."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.noise.command import measure_noise, resume_noise
    from strict_gate.noise.options import NoiseOptions
    from strict_gate.noise.render import profile_lines
    from strict_gate.report.text import visible

    if (config is None) == (resume is None):
        raise StrictGateError("give a CONFIG, or --resume REPORT_DIR (which measures what it was started with), "
                              "not both")
    if resume is not None and (baseline or batch or chunk or against or not prefill or runs or out or output_dir):
        raise StrictGateError("--resume measures what REPORT_DIR was started with: give it no other option")
    progress, hook = progress_bars()
    with progress:
        if resume is not None:
            outcome = resume_noise(resume, progress=hook)
        else:
            assert config is not None
            opts = NoiseOptions(tuple(batch or [8]), tuple(chunk or []), prefill, tuple(against or []),
                                None if baseline is None else str(baseline), runs, None if out is None else str(out))
            outcome = measure_noise(load_gate_config(config, require_candidate=False), opts, output_dir=output_dir,
                                    progress=hook)
    for line in profile_lines(outcome.profile):
        console.print(visible(line), soft_wrap=True)
    console.print(f"  profile: {visible(str(outcome.path))}; runs: {visible(str(outcome.report_dir))}")


@fail_cleanly
def diagnose(
    report_dir: Annotated[Path, typer.Argument(help="a finished gate's report directory")],
) -> None:
    """Re-score a finished gate's divergences with its reference engine and rewrite the report."""
    from strict_gate.gate.rescore import rediagnose

    outcome = rediagnose(report_dir)
    finish(outcome.result, outcome.report_dir, dec=outcome.decoder)


@fail_cleanly
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
    mode: Annotated[str | None, typer.Option(
        "--mode", help="the path dumped: auto (default: decode where prefill does not reproduce), prefill, decode, "
                       "both (side by side)")] = None,
) -> None:
    """Where along the depth a divergence first shows: both arms dump activations, compared per point."""
    from strict_gate.localize.phase import relocalize
    from strict_gate.localize.render import text_lines

    outcome = relocalize(report_dir, prompt=prompt, points=points, positions=positions, tolerance=tolerance,
                         keep=keep, graft=not no_graft, narrow=not no_narrow, mode=mode)
    for pid, loc in outcome.result.localization.items():
        console.print(Text(pid, style="bold"))  # the console prints no markup: a Text carries the style
        for line in text_lines(loc):
            console.print(line, markup=False, highlight=False)
    console.print(f"reports rewritten in {outcome.report_dir}", markup=False, highlight=False)
