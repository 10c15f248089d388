"""What a newcomer reads after a gate, run as they would run it: from a working directory of
their own, with relative paths. The near-tie gate is the shipped gates/hf-bf16-vs-hf-fp32.toml
(transformers float32 against bfloat16, the demo's flips without vLLM) on five prompts of its
battery; the divergent one replays the committed vLLM baselines at band 0.1 (no torch).

- the gate's last line names a next step that runs (`localize REPORT --prompt ID`), or says
  why localize cannot run and names `show` instead, or that nothing is divergent;
- the console says when it cuts a cell or the verdict's reasons, and where they are whole;
- a gap cell shows the signed re-scored gap its reason quotes (never 0.000 beside -0.0625);
- `gate --help` says the band's default is the config's;
- `show` (and report.html) says each prompt's later-position judgement once.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from conftest import need
from helpers import write_gate
from rich.console import Console
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.cli import common as cli_common
from strict_gate.gate.config import GateKeys
from strict_gate.judge.compare import DEFAULT_BAND
from strict_gate.offline.compare import compare_run_dirs
from strict_gate.report.console import print_result

REPO = Path(__file__).resolve().parent.parent
FIVE = ("prose-001", "prose-006", "code-007", "code-012", "list-009")  # flips of bf16 on x86 CPUs and an H200
runner = CliRunner()


@dataclass(frozen=True)
class Gate:
    root: Path  # the working directory it ran from
    output: str  # what it printed
    exit_code: int
    report: str  # its report directory, relative to root

    def report_json(self) -> dict:
        return json.loads((self.root / self.report / "report.json").read_text(encoding="utf-8"))


def _gate(root: Path, config: str, width: int = 80) -> Gate:
    """`strict-gate gate CONFIG` from `root` on a `width`-column console."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(cli_common.console, "width", width)
        r = runner.invoke(app, ["gate", config])
    (report,) = re.findall(r"report: (\S+)/report\.md", r.output)
    return Gate(root, r.output, r.exit_code, report)


@pytest.fixture(scope="module")
def near_ties(tmp_path_factory) -> Gate:
    need("transformers")
    root = tmp_path_factory.mktemp("newcomer")
    lines = (REPO / "prompts" / "battery-128.jsonl").read_text(encoding="utf-8").splitlines()
    (root / "five.jsonl").write_text("".join(x + "\n" for x in lines if json.loads(x)["id"] in FIVE))
    shipped = (REPO / "gates" / "hf-bf16-vs-hf-fp32.toml").read_text(encoding="utf-8")
    assert 'prompts = "../prompts/battery-128.jsonl"' in shipped
    (root / "gate.toml").write_text(shipped.replace("../prompts/battery-128.jsonl", "five.jsonl"))
    gate = _gate(root, "gate.toml")
    assert gate.exit_code == 1, gate.output
    statuses = {p["status"] for p in gate.report_json()["prompts"]}
    assert "near_tie" in statuses and "divergent" not in statuses, gate.output
    return gate


def _offline(root: Path, candidate: str = "tiny-llama-vllm-bf16") -> Gate:
    """The committed vLLM baselines replayed (band 0.1: divergent prompts), paths relative to `root`."""
    base = Path(os.path.relpath(REPO / "baselines", root))
    write_gate(root, name="offline", prompts=str(Path(os.path.relpath(REPO / "prompts", root)) / "battery-128.jsonl"),
               max_tokens=16, policy="strict", band=0.1, output_dir="reports",
               reference={"kind": "recorded", "path": str(base / "tiny-llama-vllm-fp32")},
               candidate={"kind": "recorded", "path": str(base / candidate)})
    return _gate(root, "gate.toml")


def _last_line(gate: Gate) -> str:
    return gate.output.rstrip().splitlines()[-1].strip()


def _typed(line: str, monkeypatch, root: Path):
    """The command a line names, run as typed (from `root`, through the CLI)."""
    words = shlex.split(line[line.index("strict-gate "):].split(" (")[0])
    assert words[0] == "strict-gate"
    monkeypatch.chdir(root)
    return runner.invoke(app, words[1:])


def test_a_near_tie_gate_names_a_localize_command_that_runs(near_ties, monkeypatch):
    line = _last_line(near_ties)
    assert line.startswith("nothing divergent to localise: every flip is a near-tie"), near_ties.output
    assert f"strict-gate localize {near_ties.report} --prompt " in line
    # the bare form is what a newcomer would have typed, and it is refused on a report of near-ties
    monkeypatch.chdir(near_ties.root)
    bare = runner.invoke(app, ["localize", near_ties.report])
    assert bare.exit_code == 2 and "nothing divergent to localise" in bare.output
    r = _typed(line, monkeypatch, near_ties.root)
    assert r.exit_code == 0, r.output
    pid = shlex.split(line)[-1]
    assert pid in r.output and "first beyond tolerance" in r.output and "reports rewritten" in r.output
    assert {p["id"]: p["status"] for p in near_ties.report_json()["prompts"]}[pid] == "near_tie"


def test_a_divergent_gate_that_cannot_localize_says_why_and_names_show(tmp_path, monkeypatch):
    gate = _offline(tmp_path)
    assert gate.exit_code == 1, gate.output
    line = _last_line(gate)
    first = next(p["id"] for p in gate.report_json()["prompts"] if p["status"] == "divergent")
    assert line.startswith(f"next: strict-gate show {gate.report} --prompt {first} "), gate.output
    assert "localize cannot run here: the candidate (recorded) cannot dump activations" in line
    shown = _typed(line, monkeypatch, tmp_path)
    assert shown.exit_code == 0 and f"{first}  divergent at position" in shown.output, shown.output
    refused = runner.invoke(app, ["localize", gate.report, "--prompt", first])  # what the line says it spares
    assert refused.exit_code == 2 and "cannot dump activations" in refused.output, refused.output


def test_a_gate_where_nothing_flipped_names_no_next_step(tmp_path):
    gate = _offline(tmp_path, candidate="tiny-llama-vllm-fp32")
    assert gate.exit_code == 0, gate.output
    assert "localize" not in gate.output and "next:" not in gate.output
    assert _last_line(gate).startswith("report: ")


def _table(text: str) -> str:
    """The console table alone: up to the first line after it (a note, or the verdict)."""
    return re.split(r"\n(?:gaps a→b|cells ending|\.\.\. \d+ more|FAIL|PASS)", text)[0]


def test_the_console_says_when_it_cuts_cells_and_where_they_are_whole(near_ties):
    out = near_ties.output
    assert "…" in _table(out)  # the table cut something at 80 columns ...
    assert (f"cells ending in … are cut to fit 80 columns: whole in {near_ties.report}/report.md, or strict-gate "
            f"show {near_ties.report} --prompt ID") in " ".join(out.split())  # ... and says so, and where


def test_the_cut_note_comes_exactly_when_a_cell_is_cut():
    result = compare_run_dirs(REPO / "baselines" / "tiny-llama-vllm-fp32", REPO / "baselines" / "tiny-llama-vllm-bf16",
                              policy="strict", band=0.1)
    bad = [p for p in result.comparison.prompts if p.status != "match"]
    seen = set()
    for prompts, width in [(result.comparison.prompts, 80), (result.comparison.prompts, 400),
                           *(((p,), 400) for p in bad[:12])]:
        buf = io.StringIO()
        one = replace(result, comparison=replace(result.comparison, prompts=tuple(prompts)))
        print_result(one, Console(file=buf, width=width, color_system=None), report_dir="reports/x")
        cut = "…" in _table(buf.getvalue())
        assert ("cut to fit" in buf.getvalue()) == cut, buf.getvalue()
        seen.add(cut)
    assert seen == {True, False}


def test_the_console_says_when_it_cuts_the_verdicts_reasons():
    result = compare_run_dirs(REPO / "baselines" / "tiny-llama-vllm-fp32", REPO / "baselines" / "tiny-llama-vllm-bf16",
                              policy="strict", band=0.1)
    assert len(result.verdict.reasons) > 6
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=80, color_system=None), report_dir="reports/x")
    assert f"... {len(result.verdict.reasons) - 6} more reason(s) in reports/x/report.md" in buf.getvalue()


def _rescored_cells(gate: Gate) -> list[tuple[str, str, float, float | None]]:
    """(prompt, side, re-scored gap, decode-time gap) wherever the two read otherwise at 4 decimals."""
    out = []
    for p in gate.report_json()["prompts"]:
        d = p["first_divergence"] or {}
        for side in ("reference", "candidate"):
            r, g = (d.get(f"{side}_rescored") or {}).get("gap"), d.get(f"{side}_gap")
            if r is not None and (g is None or f"{g:.4f}" != f"{r:.4f}"):
                out.append((p["id"], side, r, g))
    return out


def test_a_gap_cell_shows_the_signed_re_scored_gap_its_reason_quotes(near_ties, monkeypatch):
    cells = _rescored_cells(near_ties)
    assert cells, "bf16's prefill ranks some tie otherwise than its decode did"
    md = (near_ties.root / near_ties.report / "report.md").read_text(encoding="utf-8")
    page = (near_ties.root / near_ties.report / "report.html").read_text(encoding="utf-8")
    reasons = {p["id"]: p.get("reason") or "" for p in near_ties.report_json()["prompts"]}
    monkeypatch.chdir(near_ties.root)
    for pid, side, r, g in cells:
        assert f"{side} {r:.4g}" in reasons[pid]  # the reason quotes the re-scored gap ...
        both = f"{'n/a' if g is None else f'{g:.4f}'} (re-scored {r:.4f})"
        row = next(x for x in md.splitlines() if x.startswith(f"| {pid} |"))
        assert f"| {both} |" in row, row  # ... so the table shows it, signed, beside the decode-time one
        assert page.count(f"<td>{both}</td>") >= 1 and f" gap <b>{both}</b>" in page
        shown = runner.invoke(app, ["show", near_ties.report, "--prompt", pid], terminal_width=200)
        assert f"{side} gap {both}" in " ".join(shown.output.split()), shown.output
        console_row = next(x for x in near_ties.output.splitlines() if x.strip().startswith(f"{pid} "))
        assert f"→{r:.3f}" in console_row, console_row
    assert "gaps a→b: a from the arm's decode-time top-k, b re-scored" in " ".join(near_ties.output.split())


def test_gate_help_says_the_band_default_comes_from_the_config():
    r = runner.invoke(app, ["gate", "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    band = " ".join(r.output[r.output.index("--band"):r.output.index("--output-dir")].split())
    assert "default: the config's `band` key" in band
    assert f"({DEFAULT_BAND:g} where the config sets none" in band and GateKeys.band == DEFAULT_BAND
    assert "default 0.5)" not in band  # the old words: a config's band = 0.1 is the default there


def test_show_and_the_html_say_each_later_judgement_once(near_ties, monkeypatch):
    monkeypatch.chdir(near_ties.root)
    page = (near_ties.root / near_ties.report / "report.html").read_text(encoding="utf-8")
    later = {p["id"]: p["diagnosis"]["later"]["summary"] for p in near_ties.report_json()["prompts"]
             if (p.get("diagnosis") or {}).get("later")}
    assert later
    for pid, summary in later.items():
        r = runner.invoke(app, ["show", near_ties.report, "--prompt", pid])
        assert r.exit_code == 0, r.output
        assert " ".join(r.output.split()).count(summary) == 1, r.output
        section = re.search(rf"<section class='prompt'><h3 id='p-{re.escape(pid)}'>.*?</section>", page, re.S)
        assert section is not None and section.group(0).count(summary) == 1, section


@pytest.mark.parametrize("mode", ["", "no_dump"])
def test_a_command_engine_could_dump_as_its_hello_said(mode, tmp_path):
    """The gate's next step reads a command candidate's dump capability from the info its run
    kept (its hello), since the engine is closed by then: the same answer as the live engine's."""
    from strict_gate.engines.command.engine import CommandEngine
    from strict_gate.engines.command.options import CommandOptions

    toy = Path(__file__).resolve().parent / "engines" / "toy_dump_engine.py"
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(toy)]), env={"MODE": mode}, base_dir=tmp_path)
    eng.log_path = tmp_path / "engine.log"
    try:
        eng.start()
        info = eng.info()
    finally:
        eng.close()
    assert CommandEngine.could_dump(info) is eng.can_dump is (mode != "no_dump")
