"""The reference's noise in every format: a profile's table (console, `strict-gate noise`), and
in a gate's reports the candidate's flips against it: lines (console, md, JUnit) and a picture
(html: one inline SVG, no script, the candidate's first-divergence gaps over the reference's
self-flips on one axis, with the band). `SECTION` is its entry in report/sections.py's registry.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.text import Text

from strict_gate.judge.result import GateResult
from strict_gate.noise.annotate import NoiseJudgement, Where
from strict_gate.noise.profile import NoiseProfile
from strict_gate.report.html_prompt import escape
from strict_gate.report.sections import Section
from strict_gate.report.text import md, visible

HEAD = ("variation", "build", "prompts flipped", "flips / positions", "largest gap", "gap unknown", "what")
COLORS = {Where.WITHIN: "#2da44e", Where.BEYOND_NOISE: "#d4a72c", Where.BEYOND_BAND: "#cf222e",
          Where.UNKNOWN: "#cf222e"}
CONSOLE_FLIPS = 10
W, LEFT, RIGHT = 640, 150, 20
ROWS = (("reference vs itself", 30), ("another build", 60), ("candidate flips", 90))


def of(r: GateResult) -> NoiseJudgement | None:
    j = r.feature("noise")
    return j if isinstance(j, NoiseJudgement) else None


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def profile_rows(p: NoiseProfile) -> list[tuple[str, ...]]:
    return [(v.name, "same" if v.same_build else "other", f"{v.prompts_flipped}/{v.prompts}",
             f"{v.flips}/{v.positions}", _g(v.largest_gap), str(v.unknown_gaps), v.detail) for v in p.variations]


def profile_lines(p: NoiseProfile) -> list[str]:
    """The profile as `strict-gate noise` prints it: a markdown table, then its figures."""
    prov = p.provenance
    out = [f"noise of {prov.model} ({prov.dtype}, {prov.engine}) on {prov.battery.name} "
           f"({prov.battery.count} prompts), K = {prov.k}", "",
           "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(md(c) for c in row) + " |" for row in profile_rows(p)]
    ties = len(p.exact_ties)
    out += ["", f"largest self-flip gap (same build): {_g(p.largest_self_flip_gap)} nats; largest magnitude at a "
            f"self-flip: {_g(p.largest_magnitude)}; exact ties in the golden run: {ties}"]
    return out + [f"note: {n}" for n in prov.notes]


def console_lines(j: NoiseJudgement) -> list[str]:
    return [f"noise: {line}" for line in j.lines(cap=CONSOLE_FLIPS)]


def markdown_section(j: NoiseJudgement) -> list[str]:
    out = ["## The reference's own noise", "", j.headline(), "", f"Profile `{md(j.profile)}`: {md(j.measured)}.", ""]
    if j.band_rule:
        out += [f"The band is measured: {md(j.band_rule)} (docs/noise.md).", ""]
    out += ["| variation | build | prompts flipped | largest gap |", "|---|---|---|---|"]
    out += [f"| {md(r.variation)} | {'same' if r.same_build else 'other'} | {r.prompts_flipped}/{r.prompts} | "
            f"{_g(r.largest_gap)} |" for r in j.rates]
    if j.flips:
        out += ["", "| prompt | pos | ref gap | ulps | cand gap | ulps | against the reference's noise |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {md(f.id)} | {f.position} | {_g(f.gap)} | {_g(f.ulps)} | {_g(f.candidate_gap)} | "
                f"{_g(f.candidate_ulps)} | {md(j.describe(f.where))} |" for f in j.flips]
    return out + [f"- note: {md(n)}" for n in j.notes] + [""]


def _x(gap: float, top: float) -> float:
    return LEFT + (W - LEFT - RIGHT) * min(gap, top) / top


def _dots(gaps, y: int, top: float, color: str, title: str) -> list[str]:
    out = []
    for i, g in enumerate(gaps):
        jitter = (i * 7) % 13 - 6
        out.append(f"<circle cx='{_x(g, top):.1f}' cy='{y + jitter}' r='3' fill='{color}' fill-opacity='0.6'>"
                   f"<title>{escape(title)} {g:.4g} nats</title></circle>")
    return out


def svg(j: NoiseJudgement) -> str:
    """The three rows of first-divergence gaps on one nat axis, the band and the noise's reach."""
    known = [f.gap for f in j.flips if f.gap is not None]
    top = max([j.band, *j.self_gaps, *j.build_gaps, *known, 1e-3]) * 1.08
    parts = [f"<svg class='noise' xmlns='http://www.w3.org/2000/svg' width='{W}' height='135' role='img' "
             "aria-label='first-divergence gaps: the reference against itself and the candidate'>"]
    for label, y in ROWS:
        parts.append(f"<text x='4' y='{y + 4}'>{label}</text><line x1='{LEFT}' x2='{W - RIGHT}' y1='{y}' y2='{y}' "
                     "stroke='#d0d7de'/>")
    parts += _dots(j.self_gaps, ROWS[0][1], top, "#57606a", "self-flip")
    parts += _dots(j.build_gaps, ROWS[1][1], top, "#8c959f", "another build's flip")
    for f in j.flips:
        if f.gap is not None:
            parts += _dots([f.gap], ROWS[2][1], top, COLORS[f.where], f"{f.id} @ {f.position}:")
    unknown = sum(f.gap is None for f in j.flips)
    if unknown:
        parts.append(f"<text x='{W - RIGHT - 150}' y='{ROWS[2][1] + 18}' fill='#cf222e'>+{unknown} outside the "
                     "top-k</text>")
    bx = _x(j.band, top)
    parts.append(f"<line x1='{bx:.1f}' x2='{bx:.1f}' y1='15' y2='105' stroke='#cf222e' stroke-dasharray='4 3'/>"
                 f"<text x='{bx + 3:.1f}' y='14' fill='#cf222e'>band {j.band:.3g}</text>")
    if j.largest_self_flip_gap is not None:
        nx = _x(j.largest_self_flip_gap, top)
        parts.append(f"<line x1='{nx:.1f}' x2='{nx:.1f}' y1='20' y2='100' stroke='#57606a'/>"
                     f"<text x='{nx + 3:.1f}' y='118'>self-flips reach {j.largest_self_flip_gap:.3g}</text>")
    parts.append(f"<text x='{LEFT}' y='132'>0</text><text x='{W - RIGHT - 60}' y='132'>{top:.3g} nats</text></svg>")
    return "".join(parts)


def html_section(j: NoiseJudgement) -> str:
    rows = "".join(f"<tr><td>{escape(f.id)}</td><td>{f.position}</td><td>{_g(f.gap)}</td><td>{_g(f.ulps)}</td>"
                   f"<td>{_g(f.candidate_gap)}</td><td style='color:{COLORS[f.where]}'>{escape(j.describe(f.where))}"
                   "</td></tr>" for f in j.flips)
    rule = f"<p>The band is measured: {escape(j.band_rule)}</p>" if j.band_rule else ""
    notes = "".join(f"<li class='none'>note: {escape(n)}</li>" for n in j.notes)
    return (f"<h2 id='noise'>The reference's own noise</h2><p><b>{escape(j.headline())}</b></p>"
            f"<p class='none'>profile {escape(j.profile)}: {escape(j.measured)}</p>{rule}{svg(j)}"
            + (f"<table><tr><th>prompt</th><th>pos</th><th>ref gap</th><th>ulps</th><th>cand gap</th>"
               f"<th>against the reference's noise</th></tr>{rows}</table>" if rows else "")
            + (f"<ul>{notes}</ul>" if notes else ""))


def _console(r: GateResult, console: Console) -> None:
    if (nz := of(r)) is not None:
        for line in console_lines(nz):
            console.print(Text(f"  {visible(line)}"))


def _properties(r: GateResult) -> list[tuple[str, str]]:
    nz = of(r)
    return [] if nz is None else [("noise", nz.headline()),
                                  ("noise_band_rule", nz.band_rule or "the band is the config's")]


def _prompts(r: GateResult) -> Mapping[str, list[str]]:
    nz = of(r)
    return {} if nz is None else {
        f.id: [f"noise: gap {f.gap} at position {f.position}: {nz.describe(f.where)}"] for f in nz.flips}


SECTION = Section(
    "noise",
    # the rates side by side, and the band's source when it was measured
    markdown_head=lambda r: [] if (nz := of(r)) is None else [
        f"{md(nz.headline())}; see The reference's own noise below.", ""],
    markdown=lambda r, dec: [] if (nz := of(r)) is None else markdown_section(nz),
    html=lambda r: "" if (nz := of(r)) is None else html_section(nz),
    console=_console,
    junit_properties=_properties,
    junit_prompts=_prompts,
)
