"""report.html: what a reviewer reads at a glance. One self-contained file: no script, no network.

Verdict banner and figures first; then an agreement strip per non-matching prompt, the
side-by-side detail of each, drift and trend when the result carries them. Matching prompts
are a count and a capped list of ids, so a 10,000-prompt gate stays a reasonable file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

from strict_gate.judge.cascade import later_totals
from strict_gate.judge.compare import Status
from strict_gate.judge.diagnose import Diagnosis, without_later
from strict_gate.judge.result import GateResult, overall_verdict, status_label, verdict_heading
from strict_gate.judge.tally import headline
from strict_gate.report import later_view
from strict_gate.report.gaps import LEGEND, gap_cells
from strict_gate.report.html_prompt import anchor, detail, escape, strip
from strict_gate.report.html_trend import VERDICT_COLOR, trend_svg
from strict_gate.report.missing import listed, missing_lines
from strict_gate.report.sections import in_order
from strict_gate.report.style import CSS
from strict_gate.report.text import Decoder, gate_decoder
from strict_gate.runs.records import Record
from strict_gate.runs.stream import RunRecords

DETAIL_CAP = 500  # prompts drawn in full detail; the rest are in report.json
MATCH_IDS_CAP = 2000  # matching ids listed in the collapsed list
READ_AHEAD = 8  # drawn prompts whose records are read from disk at once
REASONS_CAP = 4  # the policy's reasons shown under the banner; every prompt's own is in the table


def _figures(r: GateResult) -> str:
    s = r.comparison.summary
    figs = [("prompts exact", f"{s.prompts_exact}/{s.prompts_total}"),
            ("positions matched", f"{s.positions_matched}/{s.positions_total}"),
            ("prefix positions", f"{s.prefix_positions}/{s.positions_total}")]
    figs += headline(s.counts, r.flips)
    gaps = [p.first_divergence.reference_gap for p in r.comparison.prompts
            if p.status == Status.NEAR_TIE and p.first_divergence and p.first_divergence.reference_gap is not None]
    if gaps:
        figs.append(("largest near-tie gap", f"{max(gaps):.3f} nats"))
    if r.diagnoses:
        downstream = sum(1 for d in r.diagnoses.values() if d.error is None and d.downstream_only)
        figs.append(("rest downstream of the flip", f"{downstream}/{len(r.diagnoses)}"))
    t = later_totals(r.comparison.prompts, r.later)
    if t.later:
        figs += [("later positions judged", f"{t.judged}/{t.later}"), ("later flips", str(t.flips)),
                 ("later divergent", str(t.divergent))]
    return "<div class='figs'>" + "".join(f"<div class='fig'><b>{v}</b>{k}</div>" for k, v in figs) + "</div>"


def _diagnosis(r: GateResult, p) -> Diagnosis | None:
    """The prompt's diagnosis for its detail: where the later section's line gives the later
    positions' judgement, the verdict without it, so the detail says it once."""
    dg = r.diagnoses.get(p.id)
    if dg is None or dg.later is None or later_view.prompt_line(r, p) is None:
        return dg
    return replace(dg, verdict=without_later(dg.verdict, dg.later.summary()))


def _drift_note(r: GateResult, p) -> str:
    label = status_label(r, p)
    return "" if label == str(p.status) else f"<br><small>{escape(label)}</small>"


def _row(r: GateResult, p, dec: Decoder, reasons: dict[str, str], linked: bool) -> str:
    d = p.first_divergence
    ref, cand = r.reference_records.get(p.id), r.candidate_records.get(p.id)
    link = f"<a href='#{anchor(p.id)}'>{escape(p.id)}</a>" if linked else escape(p.id)
    return (
        f"<tr><td>{link}</td><td><span class='st {p.status}'>{p.status}</span>{_drift_note(r, p)}</td>"
        f"<td>{strip(p, dec, ref, cand) if d is not None else escape(p.detail)}</td>"
        f"<td>{'' if d is None else d.position}</td>"
        + "".join(f"<td>{escape(c)}</td>" for c in (("", "") if d is None else gap_cells(d)))
        + f"<td>{p.matched_positions}/{p.positions}</td>"
        f"<td>{escape(r.diagnoses[p.id].short if p.id in r.diagnoses else reasons.get(p.id, ''))}</td></tr>"
    )


def _overview(r: GateResult, bad, dec: Decoder, reasons: dict[str, str]) -> Iterator[str]:
    """The table a row at a time: 10,000 strips are never one string."""
    yield ("<h2>Prompts that do not match</h2><p class='legend'>One cell per position: "
           "<i class='m'>&nbsp;&nbsp;</i> match, <i class='t'>&nbsp;&nbsp;</i> near-tie, "
           "<i class='d'>&nbsp;&nbsp;</i> divergent, <i class='a'>&nbsp;&nbsp;</i> after the divergence; "
           f"hover a cell for its tokens; {escape(LEGEND)}.</p>"
           "<table><tr><th>prompt</th><th>status</th><th>agreement</th><th>pos</th><th>ref gap</th>"
           "<th>cand gap</th><th>matched</th><th>why</th></tr>")
    for i, p in enumerate(bad):
        yield _row(r, p, dec, reasons, linked=i < DETAIL_CAP)
    yield "</table>"


def _matching(matching) -> str:
    ids = ", ".join(escape(p.id) for p in matching[:MATCH_IDS_CAP])
    more = f" … and {len(matching) - MATCH_IDS_CAP} more (report.json)" if len(matching) > MATCH_IDS_CAP else ""
    positions = sum(p.matched_positions for p in matching)
    return (f"<details class='matching'><summary>{len(matching)} prompt(s) match token for token "
            f"({positions} positions)</summary><p>{ids}{more}</p></details>")


def _engines(r: GateResult) -> str:
    rows = []
    arms = [("reference", r.reference), ("candidate", r.candidate)]
    for arm, info in arms + ([("rescorer", r.rescorer)] if r.rescorer is not None else []):
        versions = ", ".join(f"{k} {v}" for k, v in sorted(info.versions.items())) or "unknown"
        env = ", ".join(f"{k}={v}" for k, v in sorted(info.env.items())) or "none"
        rows.append(f"<tr><td>{arm}</td><td>{escape(info.kind)}</td><td>{escape(str(info.model))}</td>"
                    f"<td>{escape(env)}</td><td>{escape(versions)}</td></tr>")
    ps = r.prompt_set
    log = r.rescorer.options.get("log_used") if r.rescorer is not None else None
    if log:
        rows.append(f"<tr><td colspan='5'>rescorer log: <code>{escape(str(log))}</code></td></tr>")
    return ("<h2>Engines</h2><table><tr><th>arm</th><th>kind</th><th>model</th><th>env</th><th>versions</th></tr>"
            f"{''.join(rows)}</table><p>prompt set {escape(str(ps.get('name')))} ({escape(str(ps.get('count')))} "
            f"prompts), sha256 <code>{escape(str(ps.get('sha256')))}</code>; greedy, max_tokens "
            f"{r.sampling.max_tokens}, top_logprobs {r.sampling.top_logprobs}</p>")


def _slot(slot: str, *args) -> str:
    """Each section's part of report.html at `slot`, a line each (empty where it has none)."""
    return "\n".join(section(*args) for section in in_order(slot))


def _read(records: Mapping[str, Record], ids: list[str]) -> Mapping[str, Record]:
    """These ids' records: a run on disk reads their lines in one go (one pass over READ_AHEAD
    lines, not READ_AHEAD reads of one), a run in memory is looked up."""
    return records.read(ids) if isinstance(records, RunRecords) else records


def _drawn(r: GateResult, prompts: list) -> Iterator[tuple]:
    """Each drawn prompt with its two records, READ_AHEAD prompts' records held at a time."""
    for k in range(0, len(prompts), READ_AHEAD):
        batch = prompts[k : k + READ_AHEAD]
        ids = [p.id for p in batch]
        refs, cands = _read(r.reference_records, ids), _read(r.candidate_records, ids)
        for p in batch:
            yield p, refs.get(p.id), cands.get(p.id)


def _details(r: GateResult, bad, dec: Decoder, reasons: dict[str, str]) -> Iterator[str]:
    """Each drawn prompt's detail, built only when it is written: its records are read with the
    next READ_AHEAD prompts' and let go after them (a RunRecords reads them from disk, keeps none)."""
    if not bad:
        return
    yield "<h2>Side by side</h2>"
    per_prompt = [section(r) for section in in_order("html_prompts")]  # each section's part of a prompt's detail
    for p, ref, cand in _drawn(r, bad[:DETAIL_CAP]):
        yield detail(p, dec, ref, cand, _diagnosis(r, p), reason=reasons.get(p.id, p.detail),
                     rescored_by=r.rescored_by, drift_html="".join(part.get(p.id, "") for part in per_prompt))
    if len(bad) > DETAIL_CAP:
        yield f"<p>{len(bad) - DETAIL_CAP} more non-matching prompts: see report.json</p>"


def _why(r: GateResult) -> str:
    v = r.verdict
    why = "".join(f"<li>{escape(x)}</li>" for x in v.reasons[:REASONS_CAP])
    if len(v.reasons) > REASONS_CAP:
        why += f"<li class='none'>{len(v.reasons) - REASONS_CAP} more, per prompt in the table below</li>"
    why += "".join(f"<li class='none'>note: {escape(x)}</li>" for x in (*v.notes, *r.notes))
    return why + "".join(f"<li>problem: {escape(x)}</li>" for x in r.problems)


def _head(r: GateResult) -> str:
    s, v = r.comparison.summary, r.verdict
    headline = (f"{verdict_heading(r)}: {escape(r.name)} — {s.prompts_exact}/{s.prompts_total} prompts exact, "
                f"policy {escape(v.policy_words)}, band {v.band} nats")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>strict-gate: {escape(r.name)}</title>
<style>{CSS}</style></head><body>
<div class="banner" style="background:{VERDICT_COLOR[overall_verdict(r)[0]]}">{headline}</div>
<main>
"""


def render_parts(r: GateResult, dec: Decoder | None = None) -> Iterator[str]:
    """report.html a piece at a time, each whole elements (the head, a section, an overview row,
    one prompt's detail), so a page of 500 details is written without ever being one string."""
    dec = gate_decoder(r) if dec is None else dec
    reasons = {pv.id: pv.reason for pv in r.verdict.prompts}
    bad = listed(r.comparison.prompts)
    yield _head(r)
    yield _slot("html_banner", r) + "\n"
    yield _figures(r) + "\n"
    yield f"<ul>{_why(r)}</ul>\n"
    yield trend_svg(getattr(r, "history", ()) or ()) + "\n"
    yield _slot("html_head", r) + "\n"
    if bad:
        yield from _overview(r, bad, dec, reasons)
    yield "".join(f"<p class='missing'>{escape(line)}</p>" for line in missing_lines(r.comparison.prompts)) + "\n"
    yield _slot("html_divergences", r, dec) + "\n"
    yield _matching([p for p in r.comparison.prompts if p.status == Status.MATCH]) + "\n"
    yield _slot("html", r) + "\n"
    yield from _details(r, bad, dec, reasons)
    yield "\n" + _engines(r) + "\n"
    yield f'<p class="none">created {escape(r.created)}; the same content in report.md and report.json</p>\n</main></body></html>\n'


def render(r: GateResult, dec: Decoder | None = None) -> str:
    """report.html as one string; `dec` is the gate's one decoder when the caller already has it.
    write_reports writes render_parts instead, a part at a time."""
    return "".join(render_parts(r, dec))
