"""Commands over nights and commits: diff, nightly, bisect."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strict_gate.cli.common import (
    FailOnOpt,
    SummaryOpt,
    console,
    fail_cleanly,
    fail_on_rules,
    progress_bars,
)


@fail_cleanly
def diff(
    old_report: Annotated[Path, typer.Argument(help="last night's report directory or report.json")],
    new_report: Annotated[Path, typer.Argument(help="tonight's report directory or report.json")],
    fail_on: FailOnOpt = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write diff.json here (by default nothing is written)")
    ] = None,
) -> None:
    """What changed from one night's report to the next; exit 1 on a regression. No torch."""
    from strict_gate.nightly.diff import diff_report_files, write_diff_json
    from strict_gate.nightly.diff_markdown import render_markdown

    d = diff_report_files(old_report, new_report, fail_on=fail_on_rules(fail_on))
    console.print(render_markdown(d))
    if json_out is not None:  # never by default: a report directory's diff.json is its nightly's
        write_diff_json(d, json_out)
    raise typer.Exit(d.exit_code)


@fail_cleanly
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
    from strict_gate.nightly.diff_markdown import render_markdown
    from strict_gate.nightly.loop import NO_PREVIOUS, run_nightly
    from strict_gate.report.console import print_result
    from strict_gate.report.job_summary import write_summary

    cfg = load_gate_config(config)
    progress, hook = progress_bars()
    with progress:
        night = run_nightly(cfg, previous=previous, output_dir=output_dir, fail_on=fail_on_rules(fail_on), keep=keep,
                            progress=hook)
    print_result(night.gate.result, console, report_dir=str(night.gate.report_dir), dec=night.gate.decoder)
    console.print(render_markdown(night.diff) if night.diff else NO_PREVIOUS)
    write_summary(night.summary, summary)
    raise typer.Exit(night.exit_code)


@fail_cleanly
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
