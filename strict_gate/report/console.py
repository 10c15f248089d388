"""The rich console view: the verdict and the prompts a reviewer must look at."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from strict_gate.redact import scrub_obj
from strict_gate.report.drift_view import console_line, status_label
from strict_gate.report.result import GateResult
from strict_gate.report.text import Decoder, show_token, visible

_STYLE = {"pass": "bold green", "fail": "bold red", "incomplete": "bold yellow"}


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def print_result(r: GateResult, console: Console | None = None, report_dir: str | None = None) -> None:
    console = console or Console()
    r = scrub_obj(r)
    s = r.comparison.summary
    v = r.verdict
    dec = Decoder(r.reference.tokenizer, r.candidate.tokenizer)
    table = Table(title=Text(visible(f"strict-gate: {r.name}")), show_lines=False)
    # One line per prompt: on a narrow terminal the last column is cut, the report has it whole.
    widths = {"prompt": 10, "status": 9, "pos": 3, "ref gap": 7, "cand gap": 8}
    for col in ("prompt", "status", "pos", "reference", "candidate", "ref gap", "cand gap"):
        table.add_column(col, no_wrap=True, overflow="ellipsis", min_width=widths.get(col))
    table.add_column("teacher-forced", no_wrap=True, overflow="ellipsis", ratio=1)
    bad = [p for p in r.comparison.prompts if p.status != "match"]
    for p in bad[:40]:
        d = p.first_divergence
        dg = r.diagnoses.get(p.id)
        cells = (
            p.id,
            status_label(r, p),
            "–" if d is None else str(d.position),
            "" if d is None else show_token(dec, d.reference_token),
            "" if d is None else show_token(dec, d.candidate_token),
            "" if d is None else _g(d.reference_gap),
            "" if d is None else _g(d.candidate_gap),
            dg.short if dg else (p.detail[:60] if p.detail else ""),
        )
        table.add_row(*(Text(visible(c)) for c in cells))  # never read as rich markup, never raw control chars
    if bad:
        console.print(table)
        if len(bad) > 40:
            console.print(f"... {len(bad) - 40} more non-matching prompts in the report")
    counts = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in s.counts.items() if n and k != "match")
    console.print(
        Text.assemble(
            (f"{v.verdict.upper()}", _STYLE[v.verdict]),
            f"  policy {v.policy}, band {v.band}: prompts exact {s.prompts_exact}/{s.prompts_total}, "
            f"positions {s.positions_matched}/{s.positions_total} (prefix {s.prefix_positions})"
            + (f"; {counts}" if counts else ""),
        )
    )
    if r.drift is not None:
        console.print(Text(f"  {visible(console_line(r.drift))}"))
    for reason in v.reasons[:6]:
        console.print(Text(f"  {visible(reason)}"))
    if report_dir:
        console.print(Text(visible(f"  report: {report_dir}/report.md")))
