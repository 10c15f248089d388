"""A localisation in each format: text lines (console, show), a markdown table, an SVG curve, and
the localisation `SECTION` that report/sections.py's SECTIONS names (localize's face: only the
CLI imports it, the registry reaches it by name)."""

from __future__ import annotations

import math
from html import escape

from strict_gate.errors import InputError
from strict_gate.judge import restore
from strict_gate.judge.localization import Alone, Localization, PointDiff, kind_of
from strict_gate.judge.result import GateResult
from strict_gate.judge.schema import PromptDoc
from strict_gate.report.sections import Section

_KIND_COLOURS = {"embed": "#6e7781", "attn": "#cf222e", "mlp": "#0969da", "layer": "#1a7f37",
                 "norm": "#8250df", "logits": "#bf8700", "op": "#57606a"}


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def headline(loc: Localization) -> str:
    if loc.error is not None:
        return f"not localised: {loc.error}"
    head = f"first beyond tolerance: {first_beyond(loc)}"
    if loc.ops:
        gap = f" (or earlier, not compared: {', '.join(loc.ops_not_compared)})" if loc.ops_not_compared else ""
        head += f"; inside it, first op beyond: {first_op(loc)}{gap}"
    if loc.first_differs and loc.first_differs != loc.first_beyond:
        head += f"; first difference: {loc.first_differs}"
    if loc.grafted:
        head += (f"; grafted, beyond alone: {grafted_beyond(loc)}, "
                 f"first to differ alone: {loc.grafted_differs or 'none'}")
    if loc.not_reproduced:
        head += "; NOT REPRODUCED by the " + " and the ".join(f"{r.arm}'s {r.path} dump" for r in loc.not_reproduced)
    return head + f" (rel_diff tolerance {loc.tolerance:g}, {loc.mode})"


def first_beyond(loc: Localization) -> str:
    """The first point beyond, never alone when points before it were not compared."""
    gap = f" (or earlier, not compared: {', '.join(loc.not_compared)})" if loc.not_compared else ""
    return f"{loc.first_beyond or 'none'}{gap}"


def first_op(loc: Localization) -> str:
    """"layers.1.mlp.down_proj (grafted: wrong alone)", or none of the ops."""
    if loc.first_beyond_op is None:
        return f"none of {len(loc.ops)}"
    return f"{loc.first_beyond_op}{loc.alone_words(loc.first_beyond_op)}"


def alone_line(loc: Localization) -> str | None:
    """Every op with a verdict, by verdict; or why the ops were not grafted."""
    if not loc.alone:
        return f"grafting at ops: {loc.op_graft_note}" if loc.op_graft_note else None
    by = {v: [op for op, w in loc.alone if w is v] for v in Alone}
    return "grafted at ops: " + "; ".join(f"{v}: {', '.join(ops)}" for v, ops in by.items() if ops)


def grafted_beyond(loc: Localization) -> str:
    missing = [p.name for p in loc.grafted if p.rel_diff is None]
    gap = f" (not compared: {', '.join(missing)})" if missing else ""
    return f"{', '.join(loc.grafted_beyond) or 'none'}{gap}"


def reproduction_line(loc: Localization) -> str | None:
    return "; ".join(r.words() for r in loc.reproduction) or None


def text_lines(loc: Localization) -> list[str]:
    """For the terminal: the headline, who was compared, then one line per point; with `both`,
    the decode path's the same way after the prefill path's."""
    out = _text_lines(loc)
    if loc.decode is None:
        return out
    return [f"prefill path: {out[0]}", *out[1:], f"decode path: {(d := _text_lines(loc.decode))[0]}", *d[1:]]


def _text_lines(loc: Localization) -> list[str]:
    out = [headline(loc), f"  {loc.pattern}",
           f"  reference activations: {loc.reference_engine}; candidate: {loc.candidate_engine}"]
    if loc.reference_note:
        out.append(f"  {loc.reference_note}")
    if (line := reproduction_line(loc)) is not None:
        out.append(f"  {line}")
    grafted = {p.name: p for p in loc.grafted}
    for p in loc.points:
        g = grafted.get(p.name)
        extra = f"  grafted rel_diff {_g(g.rel_diff)}{' BEYOND' if g.beyond else ''}" if g else ""
        body = p.note or f"max|Δ| {_g(p.max_abs)}  rel_diff {_g(p.rel_diff)}  cos {_g(p.cosine)}  scale {_g(p.scale)}"
        out.append(f"  {'>' if p.beyond else ' '} {p.name:<16} {body}{extra}")
    if (line := alone_line(loc)) is not None:
        out.append(f"  {line}")
    fed = {p.name: p for p in loc.ops_grafted}
    for p in loc.ops:
        body = p.note or f"max|Δ| {_g(p.max_abs)}  rel_diff {_g(p.rel_diff)}  cos {_g(p.cosine)}  scale {_g(p.scale)}"
        g = fed.get(p.name)
        extra = f"  fed the reference's input: rel_diff {_g(g.rel_diff)}{' BEYOND' if g.beyond else ''}" if g else ""
        out.append(f"  {'>' if p.beyond else ' '} {p.name:<22} {body}  (narrowing pass){extra}")
    return out


def localization_markdown(r: GateResult) -> list[str]:
    """One compact table: a row per localised prompt."""
    if not r.localization:
        return []
    out = ["## Localisation", "",
           "| prompt | path | first beyond | rel_diff there | first difference | grafted: beyond alone | grafted: first "
           "to differ alone | reproduced | mode | reference |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    each = [(pid, path, loc) for pid, top in r.localization.items() for path, loc in _paths(top)]
    for pid, path, loc in each:
        at = next((p for p in loc.points if p.name == loc.first_beyond), None)
        if loc.error is not None:
            out.append(f"| `{pid}` | {path} | not localised: {loc.error} | | | | | | | |")
            continue
        op = f" → {first_op(loc)}" if loc.first_beyond_op else ""
        out.append(f"| `{pid}` | {path} | {first_beyond(loc)}{op} | {_g(at.rel_diff) if at else '–'} | "
                   f"{loc.first_differs or 'none'} | {grafted_beyond(loc) if loc.grafted else '–'}"
                   f" | {(loc.grafted_differs or 'none') if loc.grafted else '–'} | {_reproduced(loc)} | {loc.mode} | "
                   f"{loc.reference_engine} |")
    tols = sorted({loc.tolerance for _, _, loc in each})
    notes = sorted({loc.reference_note for _, _, loc in each if loc.reference_note})
    out += [f"- `{pid}` ({path}): {reproduction_line(loc)}" for pid, path, loc in each
            if loc.not_reproduced or loc.unchecked]
    out += [f"- `{pid}` ({path}): {line}" for pid, path, loc in each if (line := alone_line(loc)) is not None]
    out += ["", f"rel_diff = 1 - 2Σxy/(Σx²+Σy²) per point, tolerance {', '.join(f'{t:g}' for t in tols)} "
                "(docs/localize.md)."] + [f"{n}." for n in notes] + [""]
    return out


def _paths(loc: Localization) -> list[tuple[str, Localization]]:
    """(path, localisation): one for auto, prefill or decode; two, side by side, for both."""
    if loc.decode is not None:
        return [("prefill", loc), ("decode", loc.decode)]
    return [(loc.dump_mode, loc)]


def _reproduced(loc: Localization) -> str:
    """Per arm: yes, NO (the dump took another path than the generated token) or unchecked."""
    word = {True: "yes", False: "NO", None: "unchecked"}
    return ", ".join(f"{r.arm} {word[r.reproduced]} ({r.path})" for r in loc.reproduction) or "–"


def _y(v: float, lo: float, hi: float, h: int) -> float:
    return h - 10 - (math.log10(max(v, 10**lo)) - lo) / (hi - lo) * (h - 20)


def svg_curve(loc: Localization, width: int = 560, height: int = 180) -> str:
    """rel_diff over depth on a log scale, one polyline per point kind, the tolerance dashed."""
    pts = [p for p in loc.points if p.rel_diff is not None]
    if not pts:
        return ""
    vals = [p.rel_diff for p in pts if p.rel_diff and p.rel_diff > 0] + [loc.tolerance]
    lo, hi = math.floor(math.log10(min(vals))) - 1, math.ceil(math.log10(max(vals))) + 1
    step = (width - 60) / max(1, len(pts) - 1)
    xs = {p.name: 50 + i * step for i, p in enumerate(pts)}
    lines: dict[str, list[PointDiff]] = {}
    for p in pts:
        lines.setdefault(str(kind_of(p.name)), []).append(p)
    ty = _y(loc.tolerance, lo, hi, height)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="rel_diff over depth for {escape(loc.prompt_id)}">',
             f'<line x1="45" x2="{width - 5}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#000" stroke-dasharray="4 3"/>',
             f'<text x="{width - 5}" y="{ty - 3:.1f}" font-size="10" text-anchor="end">tolerance '
             f'{loc.tolerance:g}</text>',
             f'<text x="2" y="12" font-size="10">1e{hi}</text><text x="2" y="{height - 6}" font-size="10">1e{lo}</text>']
    for kind, members in lines.items():
        colour = _KIND_COLOURS.get(kind, "#000")
        coords = " ".join(f"{xs[p.name]:.1f},{_y(p.rel_diff or 0.0, lo, hi, height):.1f}" for p in members)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}">'
                     f"<title>{escape(kind)}</title></polyline>")
        for p in members:
            parts.append(f'<circle cx="{xs[p.name]:.1f}" cy="{_y(p.rel_diff or 0.0, lo, hi, height):.1f}" r="2.5" '
                         f'fill="{colour}"><title>{escape(p.name)}: rel_diff {_g(p.rel_diff)}</title></circle>')
    legend = " ".join(f'<tspan fill="{_KIND_COLOURS.get(k, "#000")}">{escape(k)}</tspan>' for k in lines)
    parts.append(f'<text x="50" y="{height - 1}" font-size="10">{legend}</text></svg>')
    return "".join(parts)


_BEYOND = ' class="beyond"'


def html_section(loc: Localization) -> str:
    """A prompt's localisation in report.html: the headline, the curve, the table; with `both`,
    the prefill path's and the decode path's."""
    if loc.decode is None:
        return _html_section(loc, "Localisation")
    return _html_section(loc, "Localisation: prefill path") + _html_section(loc.decode, "Localisation: decode path")


def _html_section(loc: Localization, title: str) -> str:
    fed = [(p, f"fed the reference's input{loc.alone_words(p.name)}") for p in loc.ops_grafted]
    rows = "".join(
        f"<tr{_BEYOND if p.beyond else ''}><td>{escape(p.name)}</td><td>{_g(p.max_abs)}</td>"
        f"<td>{_g(p.rel_diff)}</td><td>{_g(p.cosine)}</td><td>{_g(p.scale)}</td><td>{escape(note or '')}</td></tr>"
        for p, note in (*((p, p.note) for p in (*loc.points, *loc.ops)), *fed))
    note = f"<p>{escape(loc.reference_note)}</p>" if loc.reference_note else ""
    for line in (reproduction_line(loc), alone_line(loc)):
        note += f"<p>{escape(line)}.</p>" if line is not None else ""
    return (f'<div class="localization"><h4>{escape(title)}</h4><p>{escape(headline(loc))}. {escape(loc.pattern)}.</p>'
            f"{note}{svg_curve(loc)}<table><tr><th>point</th><th>max |Δ|</th><th>rel_diff</th><th>cosine</th>"
            f"<th>scale</th><th></th></tr>{rows}</table></div>")


def _stored_localization(entry: PromptDoc) -> str | None:
    """The prompt's localisation as report.json holds it; a malformed one is bad input."""
    if entry.localization is None:
        return None
    try:
        loc = restore.localization(entry.localization)
    except ValueError as e:
        raise InputError(f"report.json: a malformed localization object ({type(e).__name__}: {e})") from None
    return "localisation: " + "\n".join(text_lines(loc))


SECTION = Section(
    "localization",
    markdown=lambda r, dec: localization_markdown(r),
    html_prompts=lambda r: {pid: html_section(loc) for pid, loc in r.localization.items()},
    show_prompt=_stored_localization,
)
