"""`strict-gate battery build | show | score` (docs/battery.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strict_gate.cli.common import (
    BandOpt,
    console,
    fail_cleanly,
    progress_bars,
)
from strict_gate.errors import StrictGateError

battery_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Batteries built to be sensitive: prompts chosen by the "
                          "reference's own top-2 margins (docs/battery.md).")
HtmlOpt = Annotated[Path | None, typer.Option("--html", metavar="FILE", help="also write the figures as one HTML page")]


def _battery_out(doc: dict, html_out: Path | None) -> None:
    from strict_gate.battery.view import battery_html, print_battery
    from strict_gate.runs.records import write_text_atomic

    print_battery(doc, console)
    if html_out is not None:
        write_text_atomic(html_out, battery_html(doc))
        console.print(f"wrote {html_out}")


@battery_app.command("build")
@fail_cleanly
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
    progress, hook = progress_bars()
    with progress:
        built = build(the_pool, arm, Sampling(max_tokens, top_logprobs), rule, out, progress=hook)
    _battery_out(built.doc, None)
    console.print(f"wrote {built.path}, {built.provenance} (reference run: {built.run_dir})")


@battery_app.command("show")
@fail_cleanly
def battery_show(
    file: Annotated[Path, typer.Argument(help="a battery built by `battery build` (its provenance beside it)")],
    html_out: HtmlOpt = None,
) -> None:
    """A built battery's provenance, margin histogram and expected detection per perturbation scale."""
    from strict_gate.battery.provenance import load_provenance
    from strict_gate.runs.prompts import load_prompts

    _battery_out(load_provenance(load_prompts(file)), html_out)


@battery_app.command("score")
@fail_cleanly
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
        progress, hook = progress_bars()
        arm = load_arm_config(reference)  # type: ignore[arg-type]
        with progress:
            the_run = live_run(arm, ps, Sampling(max_tokens, top_logprobs), run_out, progress=hook)
    _battery_out(score(ps, the_run, band_v), html_out)
