"""`strict-gate battery show` and `score`: a battery's figures in the terminal and as HTML.

Both read one document (a provenance file, or what `score` computed), so a built battery and
a hand-written one are shown the same way. Every string from a file is escaped first: an id
holding a terminal escape or a <script> must not act on the reader's screen or page.
"""

from __future__ import annotations

import html
import math
import unicodedata
from itertools import pairwise

from rich.console import Console
from rich.table import Table

from strict_gate.battery.provenance import BINS, scale_key


def visible(s: object) -> str:
    """Control and format characters as \\x.. / \\u.... escapes; the rest as is."""
    out = []
    for ch in str(s):
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _bin_labels() -> list[str]:
    return [f"[{a:g}, {b:g})" if math.isfinite(b) else f">= {a:g}" for a, b in pairwise(BINS)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _fmt_margin(m: float | None) -> str:
    return "-" if m is None else f"{m:.4f}"


def _header(doc: dict) -> list[tuple[str, str]]:
    ps, ref, smp = doc["prompt_set"], doc["reference"], doc["sampling"]
    rows = [
        ("prompt set", f"{ps.get('name')}: {ps.get('count')} prompts, sha256 {ps.get('sha256')}"),
        ("reference", f"{ref.get('kind')} {ref.get('model')} "
                      + " ".join(f"{k} {v}" for k, v in sorted((ref.get("versions") or {}).items()))),
        ("sampling", f"T = {smp.get('max_tokens')} tokens, K = {smp.get('top_logprobs')} top logprobs, "
                     f"band {doc['sensitivity'].get('band')} nats"),
    ]
    if doc.get("excluded"):  # `score`: prompts its figures leave out
        rows.append(("excluded", f"{len(doc['excluded'])} prompts the reference errored on or copies of another "
                                 f"(the same token ids): the figures are over the other "
                                 f"{len(doc['sensitivity']['prompts'])}"))
    rule, pool = doc.get("rule"), doc.get("pool")
    if pool:
        rows.append(("pool", f"{pool.get('count')} prompts, sha256 {pool.get('sha256')}"))
        for f in pool.get("files", []):
            rows.append(("  file", f"{f.get('path')} ({f.get('kind')}, {f.get('prompts')} prompts) sha256 {f.get('sha256')}"))
        if pool.get("split"):
            rows.append(("  split", ", ".join(f"{k} {v}" for k, v in pool["split"].items())))
        if pool.get("excluded"):
            rows.append(("  excluded", f"{len(pool['excluded'])} prompts the reference errored on or copies "
                                       "of another (the same token ids)"))
    if rule:
        rows.append(("rule", f"{rule.get('name')}: sigma {rule.get('sigma')} nats ({rule.get('sigma_from')}), "
                             f"coverage {rule.get('coverage')}, seed {rule.get('seed')}"))
    return [(k, visible(v)) for k, v in rows]


def _histogram(doc: dict) -> list[tuple[str, int, int | None]]:
    counts = doc["sensitivity"]["histogram"]["counts"]
    pool = (doc.get("pool") or {}).get("histogram")
    return [(lab, c, pool[i] if pool else None) for i, (lab, c) in enumerate(zip(_bin_labels(), counts))]


def _detection(doc: dict) -> list[tuple[str, float, float | None]]:
    det = doc["sensitivity"]["detection"]
    rnd = (doc.get("pool") or {}).get("random_detection") or {}
    return [(k, det.get(k), rnd.get(k)) for k in (scale_key(s) for s in doc["sensitivity"]["scales"])]


def _main_scale(doc: dict) -> str:
    rule = doc.get("rule")
    return scale_key(rule["sigma"]) if rule and "sigma" in rule else scale_key(0.01)


def _by_p(doc: dict, key: str) -> list[dict]:
    return sorted(doc["sensitivity"]["prompts"], key=lambda p: -(p["p_flip"].get(key) or 0.0))


def print_battery(doc: dict, console: Console, *, top: int = 20) -> None:
    for k, v in _header(doc):
        console.print(f"{k:<11} {v}")
    n = doc["prompt_set"].get("count") or 0
    hist = Table(title="smallest top-2 margin per prompt (nats)")
    hist.add_column("margin")
    hist.add_column("battery", justify="right")
    hist.add_column("", no_wrap=True)
    has_pool = doc.get("pool") is not None
    if has_pool:
        hist.add_column("pool", justify="right")
    for lab, c, pc in _histogram(doc):
        bar = "#" * (round(30 * c / n) if n else 0)
        hist.add_row(lab, str(c), bar, *([str(pc)] if has_pool else []))
    console.print(hist)
    det = Table(title="expected detection: P(at least one prompt flips) under logit noise sigma")
    det.add_column("sigma (nats)", justify="right")
    det.add_column("this battery", justify="right")
    if has_pool:
        det.add_column(f"random {n} of the pool", justify="right")
    for k, d, r in _detection(doc):
        det.add_row(k, _pct(d), *([_pct(r)] if has_pool else []))
    console.print(det)
    key = _main_scale(doc)
    per = Table(title=f"the {top} prompts most likely to flip, P(flip) at sigma {key}")
    for col in ("id", "group", "steps", "smallest", "within band", "first small", "P(flip)"):
        per.add_column(col, justify="left" if col in ("id", "group") else "right")
    for p in _by_p(doc, key)[:top]:
        per.add_row(visible(p["id"]), visible(p.get("group", "")), str(p["steps"]), _fmt_margin(p["smallest_margin"]),
                    str(p["within_band"]), "-" if p["first_within_band"] is None else str(p["first_within_band"]),
                    _pct(p["p_flip"].get(key)))
    console.print(per)


def _table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def battery_html(doc: dict) -> str:
    """One self-contained page (no script, no external resource)."""
    n = doc["prompt_set"].get("count") or 0
    head = _table(["", ""], [[k, v] for k, v in _header(doc)])
    hist_rows = [[lab, str(c), str(pc) if pc is not None else "-"] for lab, c, pc in _histogram(doc)]
    bars = "".join(f'<div class="bar" style="width:{(300 * c // n) if n else 0}px" title="{html.escape(lab)}"></div>'
                   for lab, c, _ in _histogram(doc))
    det_rows = [[k, _pct(d), _pct(r)] for k, d, r in _detection(doc)]
    key = _main_scale(doc)
    per_rows = [[visible(p["id"]), visible(p.get("group", "")), str(p["steps"]), _fmt_margin(p["smallest_margin"]),
                 str(p["within_band"]), _pct(p["p_flip"].get(key))] for p in _by_p(doc, key)]
    title = html.escape(visible(doc["prompt_set"].get("name")))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>battery {title}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:2px 8px}}.bar{{background:#47a;height:10px;margin:2px 0}}</style></head>
<body><h1>battery {title}</h1>{head}
<h2>smallest top-2 margin per prompt (nats)</h2>{_table(["margin", "battery", "pool"], hist_rows)}{bars}
<h2>expected detection under logit noise sigma</h2>{_table(["sigma (nats)", "this battery", f"random {n} of the pool"], det_rows)}
<h2>prompts, P(flip) at sigma {html.escape(key)}</h2>
{_table(["id", "group", "steps", "smallest margin", "within band", "P(flip)"], per_rows)}
</body></html>
"""
