"""The golden's section in every format: its headline under the verdict (md, html, console), a
table of its votes and its check of the reference (md, html), each prompt's vote beside the prompt
(html, junit), its figures as JUnit properties and its lines in `strict-gate show`. `SECTION` is
its entry in report/sections.py."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.text import Text

from strict_gate.golden.load import load_golden
from strict_gate.golden.result import GoldenResult, HealthCheck, PromptVote
from strict_gate.golden.variants import VariantVotes
from strict_gate.golden.vote import Side
from strict_gate.judge.result import GateResult
from strict_gate.judge.schema import ReportDoc
from strict_gate.report.html_prompt import escape
from strict_gate.report.sections import Section
from strict_gate.report.text import Decoder, md, visible

CONSOLE_VOTES = 10
WORDS = {Side.REFERENCE: "reference (candidate off the golden)", Side.CANDIDATE: "candidate: REFERENCE OFF THE GOLDEN",
         Side.NEITHER: "neither"}


def of(r: GateResult) -> GoldenResult | None:
    g = r.feature("golden")
    return g if isinstance(g, GoldenResult) else None


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def vote_line(v: PromptVote) -> str:
    """One prompt's vote, or why there is none."""
    if v.vote is None:
        return f"golden: {v.id}: no vote at position {v.position}: {v.error}"
    return f"golden: {v.id}: {v.vote.line()}"


def _rows(g: GoldenResult, dec: Decoder | None) -> list[tuple[str, ...]]:
    def tok(t: int) -> str:
        return f"{t} {dec.token(t)!r}" if dec is not None and dec.available else str(t)

    return [(v.id, str(v.position), "–", "–", "–", "–", "–", f"no vote: {v.error}") if (vt := v.vote) is None else
            (v.id, str(v.position), tok(vt.reference_token), tok(vt.candidate_token), tok(vt.golden_argmax),
             _g(vt.reference_gap), _g(vt.candidate_gap), WORDS[vt.side]) for v in g.votes]


HEAD = ("prompt", "pos", "reference's token", "candidate's token", "golden argmax", "ref gap", "cand gap", "golden sides with")


VHEAD = ("arm", "variant", "prompt", "pos", "batch-1 token", "variant token", "golden argmax", "batch-1 gap",
         "variant gap", "golden sides with")


def _variant_rows(vv: VariantVotes, dec: Decoder | None) -> list[tuple[str, ...]]:
    def tok(t: int) -> str:
        return f"{t} {dec.token(t)!r}" if dec is not None and dec.available else str(t)

    return [(m.arm, m.variant, m.id, str(m.position), "–", "–", "–", "–", "–", f"unjudged: {m.error}")
            if (v := m.vote) is None else
            (m.arm, m.variant, m.id, str(m.position), tok(v.reference_token), tok(v.candidate_token),
             tok(v.golden_argmax), _g(v.reference_gap), _g(v.candidate_gap),
             f"{m.side}: REFERENCE's batch-1 off the golden" if m.reference_right_in_variant(vv.band) else str(m.side))
            for m in vv.votes]


def _variants_md(vv: VariantVotes, dec: Decoder | None) -> list[str]:
    out = ["", "### The golden at the variants' moves", "", f"{md(vv.headline())} (informational; docs/golden.md).", ""]
    if vv.votes:
        out += ["| " + " | ".join(VHEAD) + " |", "|" + "---|" * len(VHEAD)]
        out += ["| " + " | ".join(md(c) for c in row) + " |" for row in _variant_rows(vv, dec)]
    return out


def _variants_html(vv: VariantVotes | None) -> str:
    if vv is None:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in VHEAD)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in _variant_rows(vv, None))
    return (f"<h3>The golden at the variants' moves</h3><p>{escape(vv.headline())}</p>"
            + (f"<table><tr>{head}</tr>{rows}</table>" if rows else ""))


def _health_md(h: HealthCheck) -> list[str]:
    out = ["", f"The reference checked against the golden: {md(h.line())}.", ""]
    rows = [p for p in h.prompts if p.error is not None or (p.check is not None and p.check.first is not None)]
    if rows:
        out += ["| prompt | first off | positions off | largest gap |", "|---|---|---|---|"]
        out += [f"| {md(p.id)} | – | – | not checked: {md(p.error or '')} |" if (d := p.check) is None else
                f"| {md(p.id)} | {d.first} | {len(d.gaps)} | {_g(d.largest)} |" for p in rows]
    return out


def markdown_section(g: GoldenResult, dec: Decoder | None) -> list[str]:
    engine = "" if g.golden is None else f" ({g.golden.kind}, {g.golden.model}, {g.golden.options.get('dtype', '?')})"
    out = ["## The golden's votes", "", f"{md(g.headline())}.", "",
           f"Golden{md(engine)}; blame = {str(g.blame).lower()} (docs/golden.md)."]
    if g.votes:
        out += ["", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        out += ["| " + " | ".join(md(c) for c in row) + " |" for row in _rows(g, dec)]
    if g.health is not None:
        out += _health_md(g.health)
    if g.variants is not None:
        out += _variants_md(g.variants, dec)
    return out + [f"- note: {md(n)}" for n in g.notes] + [""]


def html_section(g: GoldenResult) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in _rows(g, None))
    health = "" if g.health is None else f"<p>The reference checked against the golden: {escape(g.health.line())}</p>"
    notes = "".join(f"<li class='none'>note: {escape(n)}</li>" for n in g.notes)
    return (f"<h2 id='golden'>The golden's votes</h2><p><b>{escape(g.headline())}</b></p>"
            + (f"<table><tr>{head}</tr>{rows}</table>" if rows else "") + health + _variants_html(g.variants)
            + (f"<ul>{notes}</ul>" if notes else ""))


def console_lines(g: GoldenResult) -> list[str]:
    out = [f"golden: {g.headline()}"]
    out += [vote_line(v) for v in g.votes[:CONSOLE_VOTES]]
    if len(g.votes) > CONSOLE_VOTES:
        out.append(f"golden: ... {len(g.votes) - CONSOLE_VOTES} more in report.md")
    if g.health is not None:
        out.append(f"golden: {g.health.line()}")
    if g.variants is not None:
        out += [f"golden: {m.line(g.variants.band)}" for m in g.variants.votes[:CONSOLE_VOTES]]
        if len(g.variants.votes) > CONSOLE_VOTES:
            out.append(f"golden: ... {len(g.variants.votes) - CONSOLE_VOTES} more variant vote(s) in report.md")
    return out


def _properties(g: GoldenResult) -> list[tuple[str, str]]:
    out = [("golden", g.headline()), ("golden_verdict", g.section_verdict)]
    out += [] if g.health is None else [("golden_reference_check", g.health.line())]
    return out + ([] if g.variants is None else [("golden_variants", g.variants.headline()),
                                                 ("golden_variants_verdict", g.variants.verdict)])


def _show(report: ReportDoc, console: Console) -> None:
    """`strict-gate show`'s lines, from report.json's section (its loader: no engine, no torch)."""
    if (stored := report.features.get("golden")) is not None:
        for line in console_lines(load_golden(stored.section)):
            console.print(Text(f"  {visible(line)}"))


def _prompts(g: GoldenResult) -> Mapping[str, list[str]]:
    return {v.id: [vote_line(v)] for v in g.votes}


SECTION = Section(
    "golden",
    markdown_head=lambda r: [] if (g := of(r)) is None else [f"{md(g.headline())}; see The golden's votes below.", ""],
    markdown=lambda r, dec: [] if (g := of(r)) is None else markdown_section(g, dec),
    html_banner=lambda r: "" if (g := of(r)) is None else f"<p><a href='#golden'>{escape(g.headline())}</a></p>",
    html=lambda r: "" if (g := of(r)) is None else html_section(g),
    html_prompts=lambda r: {} if (g := of(r)) is None else {
        pid: f"<p class='diag'>{escape(lines[0])}</p>" for pid, lines in _prompts(g).items()},
    console_lines=lambda r: [] if (g := of(r)) is None else console_lines(g),
    junit_properties=lambda r: [] if (g := of(r)) is None else _properties(g),
    junit_prompts=lambda r: {} if (g := of(r)) is None else _prompts(g),
    show=_show,
)
