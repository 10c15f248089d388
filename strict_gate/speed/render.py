"""The speed section laid out in each format (report.md, report.html, junit.xml, the console),
from the words `view.py` builds once, and the speed `SECTION` that report/sections.py's
SECTIONS names (the speed face: only the CLI imports it, the registry reaches it by name)."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from strict_gate.judge.result import GateResult
from strict_gate.judge.schema import ReportDoc
from strict_gate.report.html_prompt import escape
from strict_gate.report.sections import Section
from strict_gate.report.style import CONSOLE_STYLE
from strict_gate.report.text import md, visible
from strict_gate.speed.view import SpeedView, build, of


def _junit_text(s: str) -> str:
    return visible(s, keep_newlines=True)


def markdown_section(view: SpeedView | None) -> list[str]:
    """## Speed: the verdict and setup in words, one table row per rung, the legend last."""
    if view is None:
        return []
    out = ["## Speed", "", f"**{md(view.verdict_line)}**: the speed arm's own verdict; it never changes the "
           "token verdict.", ""]
    out += [f"- {md(x)}" for x in view.reasons] + ([""] if view.reasons else [])
    out += [f"{md(view.setup)}; {md(view.matched)}; {md(view.tokens)}.", ""]
    out += [f"- {'**' if flat else ''}{md(m)}{'**' if flat else ''}" for m, flat in view.mismatches]
    out += [""] if view.mismatches else []
    cols = view.columns()
    out += ["| " + " | ".join(md(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(f"*{md(c)}*" for c in view.kinds()) + " |"]  # the arms' kinds beneath their roles
    out += ["| " + " | ".join(md(c) for c in view.cells(row)) + " |" for row in view.rows]
    out += ["", md(view.legend), ""]
    if view.self_reported:
        out += ["Self-reported by the engines (shown beside, never used):", ""]
        out += [f"- {md(x)}" for x in view.self_reported] + [""]
    out += [f"- note: {md(x)}" for x in view.notes] + ([""] if view.notes else [])
    return out


def html_section(view: SpeedView | None) -> str:
    """The speed arm: its verdict, setup and match check, one table row per rung, the legend."""
    if view is None:
        return ""
    reasons = "".join(f"<li>{escape(x)}</li>" for x in view.reasons)
    mism = "".join(f"<li class='{'flat' if flat else ''}'>{escape(m)}</li>" for m, flat in view.mismatches)
    head = "".join(f"<th>{escape(c)}</th>" for c in view.columns())
    head += "</tr><tr class='kinds'>" + "".join(f"<th>{escape(c)}</th>" for c in view.kinds())
    rows = []
    for row in view.rows:
        cells = view.cells(row)
        ns = "ns" if any(f.measured and not f.separable for f in row.figures) else ""
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells[:-1])
                    + f"<td class='{ns}'>{escape(cells[-1])}</td></tr>")
    own = "".join(f"<li>{escape(x)}</li>" for x in view.self_reported)
    notes = "".join(f"<li class='none'>note: {escape(x)}</li>" for x in view.notes)
    return (f"<h2 id='speed'>Speed</h2><p class='speedv {escape(view.verdict)}'>{escape(view.verdict_line)}</p>"
            "<p class='none'>The speed arm's own verdict: it never changes the token verdict.</p>"
            f"{'<ul>' + reasons + '</ul>' if reasons else ''}<p>{escape(view.setup)}; {escape(view.matched)}; {escape(view.tokens)}</p>"
            f"{'<ul>' + mism + '</ul>' if mism else ''}<table class='speed'><tr>{head}</tr>{''.join(rows)}</table>"
            f"<p class='none'>{escape(view.legend)}</p>"
            + (f"<p>Self-reported by the engines (shown beside, never used):</p><ul>{own}</ul>" if own else "")
            + (f"<ul>{notes}</ul>" if notes else ""))


def speed_table(view: SpeedView) -> Table:
    """Three lines per rung, one per figure: both arms' medians (ref, cand: the roles, their kinds
    beneath) and the ratio with its interval (the reports have the arms' spreads too); it fits 80
    columns where a row per rung cannot."""
    t = Table(title=Text("speed", no_wrap=True), box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
              collapse_padding=True)
    t.add_column("rung", no_wrap=True, overflow="ellipsis", max_width=12)
    t.add_column("figure", no_wrap=True)
    for role, kind in (("ref", view.reference), ("cand", view.candidate)):  # the role, its kind beneath
        t.add_column(Text(f"{role}\n{visible(kind)}", overflow="ellipsis"), no_wrap=True, justify="right",
                     max_width=8)
    t.add_column(Text("cand/ref", overflow="ellipsis"), no_wrap=True, max_width=20)
    t.add_column("", no_wrap=True)
    for row in view.rows:
        for i, f in enumerate(row.figures):
            cells = (row.name if i == 0 else "", f"{f.label} {f.unit}", f.reference.median, f.candidate.median,
                     str(f.ratio), "" if not f.measured or f.separable else "not separable")
            t.add_row(*(Text(visible(c)) for c in cells))
    return t


def print_speed(view: SpeedView, console: Console) -> None:
    """The speed table, then the speed verdict on its own line with its reasons, setup and match check."""
    console.print(speed_table(view))
    console.print(Text(visible(view.verdict_line), style=CONSOLE_STYLE.get(view.verdict, "bold")))
    errors = [f"rung {row.name}: not measured: {row.error}" for row in view.rows
              if row.error and not any(row.error in x for x in view.reasons)]  # a reason says it already
    own = [f"self-reported, never used: {x}" for x in view.self_reported]
    for line in (*errors, *view.reasons[:6], view.setup, view.matched, *(m for m, _ in view.mismatches),
                 view.tokens, *own,
                 *(f"note: {x}" for x in view.notes)):
        console.print(Text(f"  {visible(line)}"))


def junit_case(case: ET.Element, view: SpeedView) -> None:
    """Failed when timed tokens did not verify (exit 1), below the bar or not comparable (exit 4
    both); an error when a bar is set and a rung went unmeasured (never a pass); passed, figures
    in system-out, when it holds or when no min_speed_ratio makes it a verdict."""
    why = _junit_text("\n".join(view.reasons) or view.verdict_line)
    if view.verdict in ("tokens_not_verified", "fail", "not_comparable"):
        ET.SubElement(case, "failure", message=visible(view.verdict_line)).text = why
    elif view.verdict not in ("pass", "informational"):
        ET.SubElement(case, "error", message=visible(view.verdict_line)).text = why
    ET.SubElement(case, "system-out").text = _junit_text("\n".join(view.lines()))


def _speed_head(r: GateResult) -> list[str]:
    view = of(r)  # its own line: the speed verdict never changes the token verdict
    return [] if view is None else [f"{md(view.verdict_line)}; see Speed below.", ""]


def _speed_banner(r: GateResult) -> str:
    view = of(r)
    return "" if view is None else (f"<p class='speedv {escape(view.verdict)}'><a href='#speed'>"
                                    f"{escape(view.verdict_line)}</a></p>")


def _speed_console(r: GateResult, console: Console) -> None:
    if (view := of(r)) is not None:
        print_speed(view, console)


def _speed_cases(suite: ET.Element, r: GateResult, cls: str) -> None:
    if (view := of(r)) is not None:
        junit_case(ET.SubElement(suite, "testcase", classname=cls, name="speed"), view)


def _speed_show(report: ReportDoc, console: Console) -> None:
    if (view := build(report.speed, report.engines.reference.kind)) is not None:
        print_speed(view, console)


SECTION = Section(
    "speed",
    markdown_head=_speed_head,
    markdown=lambda r, dec: markdown_section(of(r)),
    html_banner=_speed_banner,
    html=lambda r: html_section(of(r)),
    console=_speed_console,
    junit_properties=lambda r: [("speed_verdict", v.verdict)] if (v := of(r)) is not None else [],
    junit_cases=_speed_cases,
    show=_speed_show,
)
