"""Issue 50, item 6: the headline counted each prompt's first flip only. A near-tie that goes on
to divergent positions was a near-tie in the headline, a flip at the last position was left out of
"N prompt(s) flipped", and "divergent" mixed real divergences with gaps nobody knows. Each is now
counted under its own name in every format (judge/tally.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from xml.etree import ElementTree

from helpers import cascade_gate
from rich.console import Console
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.judge.cascade import later_totals
from strict_gate.judge.compare import Divergence, PromptComparison, Status
from strict_gate.judge.tally import flip_tally, headline_text
from strict_gate.report.show import show

ENGINE = Path(__file__).parent / "engines" / "cascade_engine.py"


def test_later_divergences_and_every_flipped_position_are_in_every_formats_headline(tmp_path, monkeypatch):
    """A near-tie at position 2, then tokens the reference ranks far below its argmax (3-7)."""
    monkeypatch.chdir(tmp_path)
    cascade_gate(Path("."), "count")
    result = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=400)
    assert result.exit_code == 1, result.output
    (d,) = [p for p in Path("reports").iterdir() if p.is_dir()]
    flips = json.loads((d / "report.json").read_text())["summary"]["flips"]
    n = flips["later_divergent"]
    assert n >= 1 and flips["prompts_later_divergent"] == 1 and flips["flipped_positions"] == 1 + n
    words = f"later divergent {n} in 1 prompt(s), flipped positions {1 + n}"
    assert f"near tie 1, {words}" in " ".join(result.output.split())  # the console may wrap the line
    md = (d / "report.md").read_text()
    assert f"| later divergent | {n} in 1 prompt(s) |" in md and f"| flipped positions | {1 + n} |" in md
    html = (d / "report.html").read_text()
    assert f"<b>{n} in 1 prompt(s)</b>later divergent" in html and f"<b>{1 + n}</b>flipped positions" in html
    props = {p.get("name"): p.get("value") for p in ElementTree.parse(d / "junit.xml").iter("property")}
    assert props["counts"] == f"near tie 1, {words}"
    buf = io.StringIO()
    show(d, console=Console(file=buf, width=400))
    assert f"prompts exact 0/1; near tie 1, {words}" in " ".join(buf.getvalue().split())


def _flip(pid: str, status: Status, position: int, length: int, *, candidate_top=((9, -0.1), (7, -0.2))):
    d = Divergence(position=position, reference_token=7, candidate_token=9, reference_gap=0.1, candidate_gap=0.1,
                   reference_margin=0.1, reason="", reference_top=((7, -0.1), (9, -0.2)),
                   candidate_top=candidate_top)
    return PromptComparison(pid, status, d, position, position, length, length)


def test_a_gap_nobody_knows_is_counted_apart_from_a_divergence():
    """The candidate gave no top-k: its gap is unknown, so the prompt is divergent, and named so."""
    unknown = _flip("u", Status.DIVERGENT, 1, 4, candidate_top=None)
    unknown = PromptComparison("u", Status.DIVERGENT, Divergence(**{**unknown.first_divergence.__dict__,
                                                                    "candidate_gap": None}), 1, 1, 4, 4)
    tally = flip_tally([unknown], 0.5, {})
    assert (tally.divergent, tally.gap_unknown) == (0, 1)
    assert headline_text({"match": 0, "near_tie": 0, "divergent": 1}, tally) == "gap unknown 1, flipped positions 1"


def test_a_flip_at_the_last_position_is_a_prompt_flipped():
    """p1 flips at its last position (3 of 4): nothing follows it, but it flipped."""
    prompts = [_flip("p0", Status.NEAR_TIE, 1, 4), _flip("p1", Status.NEAR_TIE, 3, 4)]
    assert later_totals(prompts, {}).flipped == 2
    assert "2 prompt(s) flipped" in later_totals(prompts, {}).line()
