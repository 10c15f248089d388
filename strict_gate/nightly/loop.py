"""The nightly loop: run a gate, diff it against the previous night's report, summarise.

The same steps for every CI (scripts/nightly.sh calls `strict-gate nightly`): the CI only has
to keep the output directory from one night to the next (a cache or an artifact). The previous
night is found through the output directory's history.jsonl, or named with `previous`.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from strict_gate.errors import ConfigError, ExitCode
from strict_gate.gate.config import GateConfig
from strict_gate.gate.outcome import GateOutcome, ProgressHook
from strict_gate.gate.run import run_gate
from strict_gate.judge.history import DEFAULT_NIGHTS, HISTORY_MAX_LINES, load_history, read_history
from strict_gate.judge.stored import load_report, report_path
from strict_gate.nightly.bisect import bisect_command
from strict_gate.nightly.diff import (
    DEFAULT_FAIL_ON,
    ReportDiff,
    diff_reports,
    write_diff_json,
)
from strict_gate.nightly.diff_markdown import render_markdown
from strict_gate.report.job_summary import capped, summary_markdown
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.records import write_text_atomic

NO_PREVIOUS = (
    "## Night to night: no previous night\n\nNo earlier report of this gate was found (the first night, "
    "or the previous night's output directory was not restored), so there is nothing to diff against.\n"
)


@dataclass(frozen=True)
class NightlyOutcome:
    gate: GateOutcome
    previous: Path | None  # last night's report.json, when there was one
    diff: ReportDiff | None
    summary: str

    @property
    def exit_code(self) -> ExitCode:
        """The gate's code when it did not pass (fail, incomplete, slower), else FAIL on a regression."""
        code = self.gate.result.exit_code
        if code != ExitCode.PASS:
            return code
        return self.diff.exit_code if self.diff else ExitCode.PASS


def bisect_hint(cfg: GateConfig, output_dir: Path, report_dir: Path, failed: bool) -> str:
    """When tonight fails: the `strict-gate bisect` command between the newest passing night's
    commit and tonight's, as the history records them (the commit of the git checkout that
    holds the gate config: in the usual layout, the candidate's own repository)."""
    if not failed:
        return ""
    nights = read_history(output_dir, 10**9, gate=cfg.name)
    tonight = nights[-1].get("commit") if nights else None
    good = next((e.get("commit") for e in reversed(nights[:-1]) if e.get("verdict") == "pass"), None)
    head = "## Bisect\n\n"
    if not isinstance(tonight, str) or not isinstance(good, str):
        missing = "commit for tonight" if not isinstance(tonight, str) else "passing night with a commit"
        return (head + f"No bisect command: the history has no {missing} (the commit recorded is the one of "
                "the git checkout holding the gate config).\n")
    if good == tonight:
        return (head + f"The last passing night ran the same commit ({good[:12]}): what changed is not a "
                "commit of this repository (a dependency, the baseline, the machine), so there is nothing to "
                "bisect here.\n")
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cfg.reference.base_dir,
                          capture_output=True, text=True, timeout=10).stdout.strip() or str(cfg.reference.base_dir)
    command = bisect_command(Path(cfg.path).resolve(), repo, good, tonight, report_dir.resolve())
    return (head + f"Tonight fails and {good[:12]} passed: the first failing commit between them, re-running "
            "only tonight's failing prompts against the stored reference:\n\n```\n" + command + "\n```\n")


def previous_report(output_dir: Path, gate: str) -> Path | None:
    """The newest report of this gate in output_dir's history whose report.json still exists."""
    for entry in reversed(read_history(output_dir, DEFAULT_NIGHTS, gate=gate)):
        name = entry.get("report_dir")
        if isinstance(name, str) and ReportDir(output_dir / name).report_json.is_file():
            return ReportDir(output_dir / name).report_json
    return None


def check_keep(keep: int) -> None:
    """--keep 0 (or less) would delete tonight's report too: refused before anything runs."""
    if keep < 1:
        raise ConfigError(f"--keep must be 1 or more (tonight's report is one of them), got {keep}")


def prune_reports(output_dir: Path, gate: str, keep: int) -> list[Path]:
    """Remove this gate's report directories that history.jsonl names beyond the newest `keep`,
    so a cached output directory stays bounded. Only directories named in the history go."""
    check_keep(keep)
    named = [e.get("report_dir") for e in read_history(output_dir, HISTORY_MAX_LINES, gate=gate)]
    dirs = list(dict.fromkeys(n for n in named if isinstance(n, str) and n and "/" not in n and n not in (".", "..")))
    removed = []
    for name in dirs[:-keep]:
        d = output_dir / name
        if d.is_dir() and ReportDir(d).gate_toml.is_file():
            shutil.rmtree(d)
            removed.append(d)
    return removed


def run_nightly(
    cfg: GateConfig,
    *,
    previous: str | Path | None = None,
    output_dir: Path | None = None,
    fail_on=DEFAULT_FAIL_ON,
    keep: int = DEFAULT_NIGHTS,
    progress: ProgressHook | None = None,
) -> NightlyOutcome:
    """Run the gate into output_dir, diff it against the previous night (given, or the newest in
    the history), write diff.json and summary.md into tonight's report directory."""
    check_keep(keep)  # bad input is found before the gate runs
    out = Path(output_dir or cfg.output_dir)
    load_history(out, 1)  # a history that is a directory or a FIFO, refused now rather than after the gate
    prev = report_path(previous) if previous is not None else previous_report(out, cfg.name)
    old = load_report(prev) if prev is not None else None
    outcome = run_gate(cfg, output_dir=out, progress=progress)
    diff = None
    if old is not None:
        new_path = ReportDir(outcome.report_dir).report_json
        diff = diff_reports(old, load_report(new_path), fail_on=fail_on, old_path=str(prev), new_path=str(new_path))
        write_diff_json(diff, ReportDir(outcome.report_dir).diff)
    summary = summary_markdown(outcome.result, outcome.decoder) + "\n" + (render_markdown(diff) if diff else NO_PREVIOUS)
    hint = bisect_hint(cfg, out, outcome.report_dir, outcome.result.exit_code == ExitCode.FAIL)
    summary = capped(summary + (("\n" + hint) if hint else ""))
    write_text_atomic(ReportDir(outcome.report_dir).summary, summary)
    prune_reports(out, cfg.name, keep)
    return NightlyOutcome(outcome, prev, diff, summary)
