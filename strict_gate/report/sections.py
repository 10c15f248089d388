"""Each section of a gate's reports beyond its token verdict, rendered by itself in each format:
the later positions after a flip, localisation, speed, invariance, the reference's noise, drift.

A `Section` holds one render function per place a writer puts sections (a slot, named after
the format and the place); each returns nothing when the result has no such section, and a
section without a place leaves it None. Each writer loops over `in_order(slot)` there, so a new
feature adds its section with one entry in `SECTIONS` and its view module, no writer branch.
Each feature lives in its own folder and declares its `SECTION` there (localize/render.py,
speed/render.py, noise/render.py, drift/render.py, invariance/render.py); `SECTIONS` names it
as "module:attr", as gate/feature.py's FEATURES names the features: report/ imports no
feature's face. The later positions' section (LATER) is the judge's, and stays here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from strict_gate.core.features import FEATURES, resolve
from strict_gate.judge.cascade import later_totals
from strict_gate.judge.result import GateResult
from strict_gate.report import later_view
from strict_gate.report.html_prompt import escape

Fn = Callable[..., Any]


@dataclass(frozen=True)
class Section:
    """One section's renderers, by slot (None: the section has nothing there)."""

    name: str
    markdown_head: Fn | None = None  # (r) -> list[str]: its line under report.md's verdict
    markdown: Fn | None = None  # (r, dec) -> list[str]: its report.md section
    html_banner: Fn | None = None  # (r) -> str: its line under report.html's banner
    html_head: Fn | None = None  # (r) -> str: its table under the trend
    html_divergences: Fn | None = None  # (r, dec) -> str: beside the non-matching prompts' table
    html: Fn | None = None  # (r) -> str: its report.html section
    html_prompts: Fn | None = None  # (r) -> {prompt id: html} in each prompt's detail
    console_lines: Fn | None = None  # (r) -> list[str]: its lines under the console's verdict
    console: Fn | None = None  # (r, console) -> None: its console table, after the reasons
    junit_properties: Fn | None = None  # (r) -> list[(name, value)]
    junit_prompts: Fn | None = None  # (r) -> {prompt id: lines} for each test case's system-out
    junit_cases: Fn | None = None  # (suite, r, classname) -> None: its own test cases
    show_prompt: Fn | None = None  # (PromptDoc) -> str | None: its text in `show`'s prompt view
    show: Fn | None = None  # (ReportDoc, console) -> None: after `show`'s prompts


def _later_prompts(r: GateResult, html: bool) -> Mapping[str, Any]:
    lines = {p.id: line for p in r.comparison.prompts if (line := later_view.prompt_line(r, p)) is not None}
    return {pid: f"<p class='diag'>{escape(line)}</p>" for pid, line in lines.items()} if html else {
        pid: [line] for pid, line in lines.items()}


def _later_console(r: GateResult) -> list[str]:
    totals = later_totals(r.comparison.prompts, r.later)
    return [totals.line()] if totals.later else []


LATER = Section(
    "later",
    markdown=later_view.markdown_section,
    html_divergences=later_view.html_section,
    html_prompts=lambda r: _later_prompts(r, html=True),
    console_lines=_later_console,
    junit_properties=later_view.junit_properties,
    junit_prompts=lambda r: _later_prompts(r, html=False),
)


# report.md's order: the later positions (the judge's), then each registered feature's section
# (core/features.py) by its report_rank. Each is "module:attr": a feature's own folder declares its
# section (its face, above report/), imported only when a writer first asks, so report/ imports no
# feature's face.
SECTIONS: tuple[str, ...] = ("strict_gate.report.sections:LATER",
                             *(f.section for f in sorted(FEATURES, key=lambda f: f.report_rank)))

# Where a slot put sections in another order before this registry (kept: the reports' bytes did
# not move), the sections it puts first, by name; every other follows in SECTIONS' order.
FIRST: dict[str, tuple[str, ...]] = {
    "markdown_head": ("speed", "noise"),
    "html_prompts": ("later", "drift"),
    "junit_properties": ("drift",),
}


@cache
def sections() -> tuple[Section, ...]:
    """The sections SECTIONS names, imported once, in its order."""
    return tuple(resolve(spec) for spec in SECTIONS)


def in_order(slot: str) -> list[Fn]:
    """The render functions of `slot`, in the order that slot shows its sections."""
    first = FIRST.get(slot, ())
    ordered = sorted(sections(), key=lambda s: first.index(s.name) if s.name in first else len(first))
    return [f for s in ordered if (f := getattr(s, slot)) is not None]


__all__ = ["FIRST", "SECTIONS", "Section", "in_order", "sections"]
