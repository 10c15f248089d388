"""report.html: the same content as the markdown, standalone, for a browser or CI artifact."""

from __future__ import annotations

import html

from strict_gate.report.result import GateResult
from strict_gate.report.text import Decoder, visible

_COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "incomplete": "#9a6700"}


def escape(text: str) -> str:
    """HTML-escaped, control characters shown as escapes (a browser would drop or garble them)."""
    return html.escape(visible(text))


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def render(r: GateResult) -> str:
    s = r.comparison.summary
    v = r.verdict
    dec = Decoder(r.reference.tokenizer, r.candidate.tokenizer)
    tok = lambda t: "(end)" if t is None else f"“{escape(dec.token(t))}” ({t})"  # noqa: E731
    rows = []
    # Non-matching prompts in full; matching ones as one count (a 10,000-prompt gate stays readable).
    matching = [p for p in r.comparison.prompts if p.status == "match"]
    for p in (p for p in r.comparison.prompts if p.status != "match"):
        d = p.first_divergence
        dg = r.diagnoses.get(p.id)
        rows.append(
            "<tr class='{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{}/{}</td><td>{}</td></tr>".format(
                "ok" if p.status == "match" else "bad",
                escape(p.id),
                p.status,
                "" if d is None else d.position,
                "" if d is None else tok(d.reference_token),
                "" if d is None else tok(d.candidate_token),
                "" if d is None else _g(d.reference_gap),
                "" if d is None else _g(d.candidate_gap),
                p.matched_positions,
                p.positions,
                escape(dg.verdict if dg else (d.reason if d else p.detail)),
            )
        )
    reasons = "".join(f"<li>{escape(x)}</li>" for x in (*v.reasons, *v.notes))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>strict-gate: {escape(r.name)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;}} table{{border-collapse:collapse;}}
td,th{{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}}
tr.ok td{{color:#555}} tr.bad td{{background:#fff5f5}}
.verdict{{color:{_COLOR[v.verdict]};font-size:1.6em;font-weight:bold}}
</style></head><body>
<div class="verdict">{v.verdict.upper()}: {escape(r.name)}</div>
<p>policy <b>{escape(v.policy)}</b>, band {v.band} nats; prompts exact {s.prompts_exact}/{s.prompts_total};
positions {s.positions_matched}/{s.positions_total} (prefix {s.prefix_positions}/{s.positions_total});
prompt set {escape(str(r.prompt_set.get('name')))} sha256 <code>{escape(str(r.prompt_set.get('sha256')))}</code></p>
<ul>{reasons}</ul>
<p>reference: {escape(r.reference.kind)} {escape(str(r.reference.model))};
candidate: {escape(r.candidate.kind)} {escape(str(r.candidate.model))}</p>
<table><tr><th>prompt</th><th>status</th><th>pos</th><th>reference</th><th>candidate</th><th>ref gap</th>
<th>cand gap</th><th>matched</th><th>why</th></tr>
{''.join(rows)}
<tr class='ok'><td colspan='9'>{len(matching)} prompt(s) match token for token
({sum(p.matched_positions for p in matching)} positions); their ids are in report.json</td></tr>
</table></body></html>
"""
