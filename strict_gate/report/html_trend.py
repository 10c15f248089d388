"""report.html: the nightly trend, read defensively.

It comes from elsewhere (the gate's history of past nights) and may be absent or partial: the
section is drawn from what is there and omitted when nothing is. The trend is a few lines of
inline SVG, no script and no library. (The drift figures are drift/render.py's.)
"""

from __future__ import annotations

from collections.abc import Iterable

from strict_gate.report.html_prompt import escape

VERDICT_COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "incomplete": "#9a6700"}
W, H, PAD = 640, 170, 42


def _pair(entry: dict, key: str, part: str) -> tuple[object, object]:
    """(part, total) of a history entry's "prompts" {exact, total} or "positions" {matched, total}."""
    d = entry.get(key)
    return (d.get(part), d.get("total")) if isinstance(d, dict) else (None, None)


def _ratio(entry: dict, key: str, part: str) -> float | None:
    a, b = _pair(entry, key, part)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return max(0.0, min(1.0, a / b))
    return None


def _series(points: list[tuple[float, float | None]]) -> str:
    return " ".join(f"{x:.1f},{PAD + (1 - y) * (H - 2 * PAD):.1f}" for x, y in points if y is not None)


def trend_svg(history: Iterable[object]) -> str:
    """Exact prompts and matched positions per night (as fractions), points coloured by verdict."""
    entries = [e for e in history if isinstance(e, dict)]
    if not entries:
        return ""
    n = len(entries)
    xs = [PAD + (i * (W - 2 * PAD) / (n - 1) if n > 1 else (W - 2 * PAD) / 2) for i in range(n)]
    exact = [(x, _ratio(e, "prompts", "exact")) for x, e in zip(xs, entries)]
    pos = [(x, _ratio(e, "positions", "matched")) for x, e in zip(xs, entries)]
    dots = []
    for (x, y), e in zip(exact, entries):
        if y is None:
            continue
        color = VERDICT_COLOR.get(str(e.get("verdict")), "#6e7781")
        title = (f"{e.get('time')} {e.get('gate', '')}: {e.get('verdict')}, prompts exact "
                 "{}/{}, positions {}/{}".format(*_pair(e, "prompts", "exact"), *_pair(e, "positions", "matched")))
        cy = PAD + (1 - y) * (H - 2 * PAD)
        dots.append(f"<circle cx='{x:.1f}' cy='{cy:.1f}' r='5' fill='{color}'><title>{escape(title)}</title></circle>")
    first, last = escape(str(entries[0].get("time", ""))), escape(str(entries[-1].get("time", "")))
    return (
        f"<h2>Trend</h2><svg class='trend' width='{W}' height='{H}' viewBox='0 0 {W} {H}' role='img' "
        "aria-label='prompts exact and positions matched per night'>"
        f"<line x1='{PAD}' y1='{PAD}' x2='{W - PAD}' y2='{PAD}' class='grid'/>"
        f"<line x1='{PAD}' y1='{H - PAD}' x2='{W - PAD}' y2='{H - PAD}' class='grid'/>"
        f"<text x='2' y='{PAD + 4}'>100%</text><text x='2' y='{H - PAD + 4}'>0%</text>"
        f"<polyline points='{_series(pos)}' class='pos'/><polyline points='{_series(exact)}' class='exact'/>"
        f"{''.join(dots)}"
        f"<text x='{PAD}' y='{H - 8}'>{first}</text><text x='{W - PAD}' y='{H - 8}' text-anchor='end'>{last}</text>"
        "</svg><p class='legend'><span class='exact'>━</span> prompts exact · <span class='pos'>━</span> "
        f"positions matched · points coloured by verdict; {n} night(s)</p>"
    )
