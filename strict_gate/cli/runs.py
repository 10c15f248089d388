"""Commands over one arm, stored runs and reports: run, check-engine, capture, compare, show, prompts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from strict_gate.cli.common import (
    ForceOpt,
    console,
    fail_cleanly,
    finish,
    progress_bars,
)
from strict_gate.errors import ConfigError, StrictGateError


@fail_cleanly
def run(
    engine_config: Annotated[Path, typer.Argument(help="engine TOML (kind, options, [env]) or a gate config")],
    prompts: Annotated[Path, typer.Option("--prompts", "-p", help="prompt set .jsonl")],
    out: Annotated[Path, typer.Option("--out", help="run directory to write")],
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 16,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", min=0)] = 5,
    runs: Annotated[int, typer.Option("--runs", min=1, help="repeat each prompt K times (samples)")] = 1,
    force: ForceOpt = False,
    shard: Annotated[str | None, typer.Option(
        "--shard", help="I/N: run only prompts k with k mod N = I (0-based; join with `strict-gate merge`)")] = None,
) -> None:
    """Run one arm only, to record a run or a baseline (or one shard of it)."""
    from strict_gate.gate.arm import prompt_inputs, run_arm
    from strict_gate.gate.config import load_arm_config
    from strict_gate.report.text import visible
    from strict_gate.runs.output import staged_run_dir
    from strict_gate.runs.prompts import load_prompts
    from strict_gate.runs.records import Sampling
    from strict_gate.shards.spec import Shard

    arm = load_arm_config(engine_config)
    ps = load_prompts(prompts)
    part = Shard.parse(shard) if shard is not None else None
    run_ps = part.select(ps) if part is not None else ps
    progress, hook = progress_bars()
    with staged_run_dir(out, force=force) as staged:
        engine = arm.build()
        try:
            inputs = prompt_inputs(run_ps, engine)
            with progress:
                result = run_arm(
                    engine, inputs, Sampling(max_tokens, top_logprobs), staged,
                    prompt_set=run_ps, runs=max(runs, arm.runs), on_record=hook(arm.kind, len(inputs)), strict=True,
                    shard=part.describe(len(ps)) if part is not None else None,
                )
        finally:
            engine.close()
    console.print(f"wrote {len(result.records)} records to {visible(str(out))}")


@fail_cleanly
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

    from strict_gate.check_engine import check_engine as run_checks
    from strict_gate.check_engine import load_engine_arm
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


@fail_cleanly
def capture(
    config: Annotated[Path, typer.Argument(help="gate TOML whose [reference] is captured")],
    runs: Annotated[int | None, typer.Option("--runs", "-k", help="K runs per prompt (default: [reference] runs, else 5)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="default: baselines/<name>")] = None,
    force: ForceOpt = False,
    shard: Annotated[str | None, typer.Option(
        "--shard", help="I/N: capture only prompts k with k mod N = I (0-based; join with `strict-gate merge`)")] = None,
) -> None:
    """Capture the reference K times (one prompt per call) into a baseline with its determinism."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.stored import capture_baseline
    from strict_gate.report.text import visible
    from strict_gate.runs.output import safe_name
    from strict_gate.shards.spec import Shard

    cfg = load_gate_config(config, require_candidate=False)
    k = runs or (cfg.reference.runs if cfg.reference.runs > 1 else 5)
    if k < 1:
        raise StrictGateError("--runs must be >= 1")
    target = out or Path("baselines") / safe_name(cfg.name)
    progress, hook = progress_bars()
    with progress:
        result = capture_baseline(cfg, target, runs=k, progress=hook, force=force,
                                  shard=Shard.parse(shard) if shard is not None else None)
    det = result.manifest.determinism or {}
    console.print(
        f"baseline {visible(str(target))}: {len(result.records)} prompts, "
        f"{det.get('prompts_deterministic')}/{det.get('prompts_total')} deterministic over {k} runs"
    )
    for nd in det.get("non_deterministic", []):
        pos = ", ".join(str(p["position"]) for p in nd["positions"][:8])
        console.print(f"  {visible(nd['id'])}: {nd['distinct_sequences']} distinct sequences, differ at {pos}")


@fail_cleanly
def merge(
    shards: Annotated[list[Path], typer.Argument(help="the N shard run directories (strict-gate run --shard I/N)")],
    out: Annotated[Path, typer.Option("--out", help="the merged run directory to write")],
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", "-p", help="the prompt set the shards were made from (its sha256 and order checked)")] = None,
    force: ForceOpt = False,
) -> None:
    """Join N shard runs into one run, after checking they are one run's shards, disjoint and complete."""
    from strict_gate.report.text import visible
    from strict_gate.shards.merge import merge_shards

    run = merge_shards(shards, out, prompts=prompts, force=force)
    console.print(f"merged {len(shards)} shards: {len(run.records)} records in {visible(str(out))}")


@fail_cleanly
def compare(
    reference_run: Annotated[Path, typer.Argument(help="reference run directory")],
    candidate_run: Annotated[Path, typer.Argument(help="candidate run directory")],
    policy: Annotated[str, typer.Option("--policy")] = "auto",
    band: Annotated[str, typer.Option("--band", help='nats, or "measured" (from --noise)')] = "0.5",
    out: Annotated[Path | None, typer.Option("--out", help="write reports to this directory")] = None,
    prompts: Annotated[
        Path | None, typer.Option("--prompts", "-p", help="the prompt set both runs were made from (expected ids)")
    ] = None,
    noise: Annotated[Path | None, typer.Option(
        "--noise", help="the reference's noise profile (noise.json): each flip placed against it")] = None,
    noise_floor: Annotated[float, typer.Option("--noise-floor", help="nats: a measured band is never below it")] = 0.0,
    noise_ulps: Annotated[float, typer.Option("--noise-ulps", help="nor below N spacings of the dtype")] = 0.0,
) -> None:
    """Compare two stored runs: no engine, no torch."""
    from strict_gate.judge.compare import check_gate_band
    from strict_gate.offline.compare import compare_run_dirs

    try:
        given = check_gate_band(band if band == "measured" else float(band))
    except ValueError as e:
        raise ConfigError(f"--band {band!r}: {e}" if "band" not in str(e) else str(e)) from None
    result = compare_run_dirs(reference_run, candidate_run, policy=policy, band=given, prompts=prompts, out=out,
                              noise=noise, noise_floor=noise_floor, noise_ulps=noise_ulps)
    finish(result, out)


@fail_cleanly
def show(
    report_dir: Annotated[Path, typer.Argument(help="a finished gate's report directory")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="show this prompt (any status)")] = None,
) -> None:
    """Both continuations side by side in the terminal: tokens, top-k, gaps, diagnosis, text."""
    from strict_gate.report.show import show as show_report

    show_report(report_dir, prompt, console)


@fail_cleanly
def prompts(file: Annotated[Path, typer.Argument(help="prompt set .jsonl")]) -> None:
    """Validate a prompt set and print its size and sha256."""
    from strict_gate.runs.prompts import load_prompts

    ps = load_prompts(file)
    n_text = sum(1 for p in ps.prompts if p.text is not None)
    console.print(f"{ps.name}: {len(ps)} prompts ({n_text} text, {len(ps) - n_text} token ids)")
    console.print(f"sha256 {ps.sha256}")
