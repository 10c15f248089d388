"""How the every-token judgement (strict_gate/judge/cascade.py) reads in report.md, report.html,
junit.xml and the console: per diverged prompt, the later positions judged, the later flips, the
worst later gap and the first later divergence with its tokens and gaps.

Kept apart from the format modules so that each of them gains a line or two, not a section.
"""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.judge.cascade import Cascade, LaterPosition, later_totals, unjudged
from strict_gate.judge.compare import PromptComparison, Status
from strict_gate.judge.policies.near_tie import UNJUDGED
from strict_gate.judge.result import GateResult
from strict_gate.report.html_prompt import escape
from strict_gate.report.text import Decoder, around, md, show_token
from strict_gate.runs.records import Record

ROWS = 50  # prompts in the report.md / report.html table (the totals are over all)


@dataclass(frozen=True)
class Row:
    id: str
    first: int
    cascade: Cascade


def rows(r: GateResult) -> list[Row]:
    """Every re-scored diverged prompt with a position after its flip, and every near-tie never
    re-scored (wholly unjudged: what makes it unverified). A divergent prompt never re-scored fails
    at its first divergence: a row would add nothing."""
    out = []
    later = r.later
    for p in r.comparison.prompts:
        d = p.first_divergence
        if p.status not in (Status.NEAR_TIE, Status.DIVERGENT) or d is None or p.candidate_length <= d.position + 1:
            continue
        if p.id in later or p.status == Status.NEAR_TIE:
            out.append(Row(p.id, d.position, later.get(p.id) or unjudged(d.position, p.candidate_length, UNJUDGED)))
    return out


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def first_divergent(dec: Decoder, lp: LaterPosition | None, cand_rec: Record | None = None) -> str:
    """The first later divergence: position, candidate token vs the reference's argmax (each
    with the character it is part of, on the candidate's own prefix), both gaps."""
    if lp is None:
        return "none"
    cand = "" if lp.candidate_rescored is None else f", candidate re-scored {_g(lp.candidate_rescored)}"
    before, after = around(cand_rec, lp.position)
    return (f"{lp.position}: {show_token(dec, lp.token, before, after)} vs argmax "
            f"{show_token(dec, lp.reference_argmax, before)} "
            f"(reference gap {_g(lp.reference_gap)}, candidate gap {_g(lp.candidate_gap)}{cand})")


def _cells(dec: Decoder, row: Row, r: GateResult) -> list[str]:
    c = row.cascade
    return [row.id, str(row.first), f"{c.judged}/{c.later}", str(c.flip_count), _g(c.worst_gap),
            first_divergent(dec, c.divergent[0] if c.divergent else None, r.candidate_records.get(row.id)),
            str(c.outcome).replace("_", "-") + (f" ({c.unverified})" if c.unverified else "")]


HEAD = ["prompt", "flip at", "later judged", "later flips", "worst later gap", "first later divergence", "after it"]
LEGEND = ("Every candidate token after the first divergence, teacher-forced on the candidate's own prefix: "
          "it follows (the reference's argmax there), is a further near-tie (both gaps within the band, the "
          "same two-sided rule), is divergent, or is not judged (unverified, never a pass). Gaps in nats: "
          "reference gap = lp_ref(argmax) − lp_ref(candidate token); candidate gap = lp_cand(candidate token) "
          "− lp_cand(reference argmax), from its decode top-k; a negative re-scored candidate gap is its "
          "prefill/decode disagreement at a tie.")


def markdown_section(r: GateResult, dec: Decoder) -> list[str]:
    rs = rows(r)
    if not rs:
        return []
    out = ["## After the first divergence (every later token)", "", md(later_totals(r.comparison.prompts,
                                                                                     r.later).line()) + ".", ""]
    out += ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(md(x) for x in _cells(dec, row, r)) + " |" for row in rs[:ROWS]]
    out += ["", md(LEGEND), ""]
    if len(rs) > ROWS:
        out += [f"... and {len(rs) - ROWS} more diverged prompts (report.json)", ""]
    return out


def html_section(r: GateResult, dec: Decoder) -> str:
    rs = rows(r)
    if not rs:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    body = "".join("<tr>" + "".join(f"<td>{escape(x)}</td>" for x in _cells(dec, row, r)) + "</tr>" for row in rs[:ROWS])
    more = f"<p>… and {len(rs) - ROWS} more diverged prompts (report.json)</p>" if len(rs) > ROWS else ""
    return (f"<h2>After the first divergence (every later token)</h2><p>"
            f"{escape(later_totals(r.comparison.prompts, r.later).line())}</p><table><tr>{head}</tr>{body}</table>"
            f"{more}<p class='legend'>{escape(LEGEND)}</p>")


def prompt_line(r: GateResult, p: PromptComparison) -> str | None:
    """One prompt's later judgement in a line (report.html's detail, junit.xml's system-out)."""
    d = p.first_divergence
    if p.status not in (Status.NEAR_TIE, Status.DIVERGENT) or d is None or p.candidate_length <= d.position + 1:
        return None
    c = r.later.get(p.id) or unjudged(d.position, p.candidate_length, UNJUDGED)
    return f"after the flip at {d.position}: {c.summary()}"


def junit_properties(r: GateResult) -> list[tuple[str, str]]:
    t = later_totals(r.comparison.prompts, r.later)
    if not t.later:
        return []
    return [("later_positions_judged", f"{t.judged}/{t.later}"), ("later_flips", str(t.flips)),
            ("later_divergent", str(t.divergent)), ("later_unverified", str(t.unverified))]
