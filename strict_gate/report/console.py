"""The rich console view: the verdict and the prompts a reviewer must look at."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from strict_gate.core.redact import scrub_obj
from strict_gate.judge.cascade import Later
from strict_gate.judge.compare import Status
from strict_gate.judge.devices import device_notes
from strict_gate.judge.result import GateResult, matched_drift
from strict_gate.judge.tally import headline_text
from strict_gate.report.gaps import ARROW, gap_cells
from strict_gate.report.missing import listed, missing_lines
from strict_gate.report.sections import in_order
from strict_gate.report.style import CONSOLE_STYLE
from strict_gate.report.text import Decoder, gate_decoder, visible
from strict_gate.runs.layout import ReportFile

_SHORT_STATUS = {Status.NEAR_TIE: "near-tie", Status.LENGTH_MISMATCH: "length",
                 Status.TOKENIZATION_MISMATCH: "tokenizer", Status.NOT_GREEDY: "not greedy"}
ROWS = 40
REASONS = 6  # the verdict's reasons printed; the report has every one


def _gaps(d) -> str:
    return " ".join(gap_cells(d, 3, compact=True))


def why(r: GateResult, p, dg) -> str:
    """A few words: the teacher-forced finding when there is one, else the comparator's cause;
    a near-tie starts with the scale of the drift at its matched positions."""
    pd = matched_drift(r, p) if p.status == Status.NEAR_TIE else None
    base = _why(p, dg)
    if pd is None:
        return base
    if dg is not None and dg.later is not None and dg.later.outcome in (Later.DIVERGENT, Later.UNVERIFIED):
        return f"{base}; {pd.short()}"  # what fails it first: the table cuts the line at the width
    return f"{pd.short()}; {base}"


def _why(p, dg) -> str:
    if dg is not None:
        if dg.error is not None:
            return "re-score failed"
        reason = p.first_divergence.reason
        head = ("tie" if dg.near_tie else "gap unknown" if "gap unknown" in reason
                else "off top-k" if dg.rescored_gap is None else "real")
        return head + _after(dg)
    d = p.first_divergence
    reason = d.reason if d is not None else p.detail
    if p.status == Status.NEAR_TIE:
        return "within band"
    if p.status == Status.DIVERGENT:
        return "off top-k" if "outside" in reason else "gap > band" if "> band" in reason else "no logprobs"
    if p.status == Status.LENGTH_MISMATCH:
        return "candidate stopped" if "candidate stopped" in reason else "reference stopped"
    return {Status.TOKENIZATION_MISMATCH: "prompt ids differ", Status.NOT_GREEDY: "not its argmax",
            Status.MISSING: "no record"}.get(p.status, reason)


def _after(dg) -> str:
    """The positions after the flip, in a few words (the report has them in full)."""
    c = dg.later
    if c is None:
        return "; rest follows" if dg.downstream_only else f"; again at {dg.later_errors[0]}"
    if c.divergent:
        return f"; later div at {c.divergent[0].position}"
    if c.unverified_from is not None:
        return f"; unverified from {c.unverified_from}"
    return f"; {c.flip_count} later flip(s)" if c.flip_count else "; rest follows"


@dataclass(frozen=True)
class Rows:
    """The console table and what it did to fit: cells it cut, whether a gap cell is a pair."""

    table: Table
    cut: bool  # a cell shortened to "…" (the id, the tokens, the reason)
    paired: bool  # a gap cell reads "decode→re-scored"


def table(r: GateResult, bad, dec: Decoder, width: int) -> Rows:
    """One line per non-matching prompt that fits `width` columns: the id, status and position
    whole; tokens without ids and the reason in a few words (the report has both in full)."""
    rows = [(p, _cells(r, p, dec)) for p in bad[:ROWS]]
    key = lambda i: max((len(c[i]) for _, c in rows), default=1)  # noqa: E731
    widths = [min(16, key(0)), key(1), 3, 14, max(len("gaps R C"), key(4))]
    widths.append(max(12, width - sum(widths) - 2 * len(widths)))  # the reason: what is left
    title = Text(visible(f"strict-gate: {r.name}"), no_wrap=True, overflow="ellipsis")
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
    t.add_column("prompt", no_wrap=True, overflow="ellipsis", width=widths[0])
    t.add_column("status", no_wrap=True, width=widths[1])
    t.add_column("pos", no_wrap=True, justify="right", width=widths[2])
    t.add_column("ref → cand", no_wrap=True, overflow="ellipsis", width=widths[3])
    t.add_column("gaps R C", no_wrap=True, width=widths[4])
    t.add_column("why", no_wrap=True, overflow="ellipsis", max_width=widths[5])
    for _, cells in rows:
        t.add_row(*(Text(c) for c in cells))  # never read as rich markup
    cut = any(cell_len(c) > w for _, cells in rows for c, w in zip(cells, widths))
    return Rows(t, cut, any(ARROW in cells[4] for _, cells in rows))


def _cells(r: GateResult, p, dec: Decoder) -> tuple[str, ...]:
    """One prompt's row, each cell made visible (never raw control characters)."""
    d = p.first_divergence
    return tuple(visible(c) for c in (
        p.id,
        _SHORT_STATUS.get(p.status, p.status),
        "–" if d is None else str(d.position),
        "" if d is None else f"“{dec.token(d.reference_token)}”→“{dec.token(d.candidate_token)}”",
        "" if d is None else _gaps(d),
        why(r, p, r.diagnoses.get(p.id)),
    ))


def _full(report_dir: str | None) -> str:
    """Where the text the console shortened is whole."""
    return f"{report_dir}/{ReportFile.MARKDOWN}" if report_dir else "the report (--out DIR writes it)"


def _table_notes(rows: Rows, width: int, report_dir: str | None) -> list[str]:
    """What the table did to fit, said: the cells it cut and where they are whole, and what a
    gap pair means."""
    out = []
    if rows.paired:
        out.append(f"gaps a{ARROW}b: a from the arm's decode-time top-k, b re-scored on the common prefix "
                   "(teacher forcing), where the two differ")
    if rows.cut:
        show = f", or strict-gate show {shlex.quote(report_dir)} --prompt ID" if report_dir else ""
        out.append(f"cells ending in … are cut to fit {width} columns: whole in {_full(report_dir)}{show}")
    return out


def _lines(text: str) -> str:
    """Escaped, its own newlines kept as indented lines (a server's log tail), never \\x0a."""
    return visible(text, keep_newlines=True).replace("\n", "\n    ")


def print_result(r: GateResult, console: Console | None = None, report_dir: str | None = None,
                 dec: Decoder | None = None) -> None:
    """The console table and verdict; `dec` is the gate's decoder when it has one (GateOutcome.decoder)."""
    console = console or Console()
    r = scrub_obj(r)
    s = r.comparison.summary
    v = r.verdict
    dec = gate_decoder(r) if dec is None else dec
    bad = listed(r.comparison.prompts)
    if bad:
        rows = table(r, bad, dec, console.width)
        console.print(rows.table)
        if len(bad) > ROWS:
            console.print(f"... {len(bad) - ROWS} more non-matching prompts in the report")
        for line in _table_notes(rows, console.width, report_dir):
            console.print(Text(visible(line)))
    for line in missing_lines(r.comparison.prompts):
        console.print(Text(_lines(line)))
    counts = headline_text(s.counts, r.flips)
    console.print(
        Text.assemble(
            (f"{v.verdict.upper()}", CONSOLE_STYLE[v.verdict]),
            f"  policy {v.policy_words}, band {v.band}: prompts exact {s.prompts_exact}/{s.prompts_total}, "
            f"positions {s.positions_matched}/{s.positions_total} (prefix {s.prefix_positions})"
            + (f"; {counts}" if counts else ""),
        )
    )
    for note in device_notes(r.reference, r.candidate, r.rescorer, r.comparison):  # beside the headline it qualifies
        console.print(Text(f"  note: {visible(note)}"))
    for section in in_order("console_lines"):
        for line in section(r):
            console.print(Text(f"  {visible(line)}"))
    for reason in v.reasons[:REASONS]:
        console.print(Text(f"  {_lines(reason)}"))
    if len(v.reasons) > REASONS:
        console.print(Text(visible(f"  ... {len(v.reasons) - REASONS} more reason(s) in {_full(report_dir)}")))
    for section in in_order("console"):
        section(r, console)
    if report_dir:
        console.print(Text(visible(f"  report: {report_dir}/{ReportFile.MARKDOWN}")))
