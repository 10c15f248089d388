"""The invariance variants in every format: a variants x figures table (md, console), one
agreement strip per moved prompt and variant (html), one test case per variant (JUnit), the
table again in `show`, and the files of `strict-gate invariance` on its own (invariance.json
last, .md, .html, junit.xml). A candidate variant run beside the reference's says, in each, how
its prompts moved beside the reference's (moves.py's words) and each move's class.
`SECTION` is its entry in report/sections.py's registry.
"""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from strict_gate.core.redact import scrub_obj
from strict_gate.invariance.config import InvariancePolicy
from strict_gate.invariance.load import load_invariance
from strict_gate.invariance.verdict import InvarianceResult, Moved, Pairing, VariantResult, VariantVerdict
from strict_gate.judge.compare import UNCOMPARED, Status
from strict_gate.judge.result import GateResult
from strict_gate.judge.schema import ReportDoc
from strict_gate.report.html_prompt import escape
from strict_gate.report.junit import suite_xml
from strict_gate.report.sections import Section
from strict_gate.report.style import CSS
from strict_gate.report.text import md, strict_json, visible
from strict_gate.runs.records import now_iso, write_text_atomic

INVARIANCE_SCHEMA = "strict-gate/invariance@1"
FILES = {"json": "invariance.json", "md": "invariance.md", "html": "invariance.html", "junit": "junit.xml"}
MOVED_CAP = 20  # moved prompts listed per variant (all are in the JSON)
HEAD = ("variant", "arm", "verdict", "prompts exact", "positions", "near-tie", "divergent", "distinct outputs", "cost")


def of(r: GateResult) -> InvarianceResult | None:
    """A GateResult's invariance verdict, when the gate ran [invariance]."""
    inv = r.feature("invariance")
    return inv if isinstance(inv, InvarianceResult) else None


def _cost(v: VariantResult) -> str:
    return "–" if v.cost is None else f"{v.cost:.2f}x"


def row(v: VariantResult) -> tuple[str, ...]:
    """One variant's figures, as every table prints them."""
    divergent = sum(1 for m in v.divergences if m.status not in (Status.NEAR_TIE, *UNCOMPARED))
    return (v.name, v.arm, v.verdict.value, f"{v.prompts_exact}/{v.prompts_total}",
            f"{v.positions_matched}/{v.positions_total}", str(v.near_ties), str(divergent),
            f"{v.distinct_outputs} ({v.prompts_distinct} prompts)" if v.prompts_distinct else str(v.distinct_outputs),
            _cost(v))


SPEC_HEAD = ("speculative variant", "arm", "tokens", "drafted", "accepted", "acceptance", "mean accepted length",
             "time (batch-1 run)")


def _counts(v: VariantResult) -> tuple[str, str, str, str]:
    a = v.acceptance
    if a is None or (a.replies == 0 and a.drafts is None):  # no counter, or every reply came without counts
        return ("unknown",) * 4
    some = f" ({a.replies}/{a.replies + a.replies_without} replies)" if a.replies_without else ""
    mean = "–" if a.mean_accepted_length is None else f"{a.mean_accepted_length:.2f}"
    return (f"{a.drafted}{some}", str(a.accepted), "–" if a.rate is None else f"{a.rate:.1%}", mean)


def speculation_row(v: VariantResult) -> tuple[str, ...]:
    """Lossless, and worth it? Tokens against the plain run, the engine's counts, the time."""
    equal = "equal" if v.prompts_exact == v.prompts_total and not v.problems else "MOVED" \
        if v.divergences else "incomplete"
    time = "–" if v.seconds is None or v.baseline_seconds is None else \
        f"{v.seconds:.3g} s ({v.baseline_seconds:.3g} s, {_cost(v)})"
    return (v.name, v.arm, f"{equal}, {v.prompts_exact}/{v.prompts_total} exact", *_counts(v), time)


def _speculative(inv: InvarianceResult) -> list[VariantResult]:
    return [v for v in inv.variants if v.exact]


def _why(m: Moved) -> str:
    gaps = ", ".join(f"{k} gap {x:.4f}" for k, x in (("batch-1", m.baseline_gap), ("variant", m.variant_gap))
                     if x is not None)
    if m.position is None:  # not compared: missing, errored, another tokenization
        return f"{m.label}: {m.reason}"
    return f"{m.label} at position {m.position}" + (f" ({gaps})" if gaps else "")


def said(v: VariantResult, m: Moved) -> str:
    """A move as every format words it: beside the reference's, its class too."""
    k = v.pairing(m.id)
    if k is None:
        return _why(m)
    theirs = next((r for r in v.reference_moves if r.id == m.id), None)
    where = f" (the reference's: {theirs.label} at position {theirs.position})" \
        if k == Pairing.DIFFERENTLY and theirs is not None else ""
    return f"{_why(m)}: {k.value}{where}"


def moves(v: VariantResult) -> list[tuple[Moved, str]]:
    """(move, words) of each move the variant lists: its own, then the reference's alone (shown
    as the reference's, never counted against the candidate)."""
    theirs = {r.id: r for r in v.reference_moves}
    own = [(m, said(v, m)) for m in v.divergences]
    return own + [(theirs[pid], f"{Pairing.REFERENCE_ONLY.value}: the reference's {_why(theirs[pid])}")
                  for pid in v.paired_ids(Pairing.REFERENCE_ONLY)]


def beside_line(v: VariantResult) -> str | None:
    """A candidate variant's prompts beside the reference's, counted by class (None: not paired,
    or neither arm moved)."""
    if not v.pairs:
        return None
    counts = "; ".join(f"{k.value}: {len(v.paired_ids(k))}" for k in Pairing)
    return f"{v.arm} {v.name} beside the reference's: {counts} (its verdict counts the candidate's own moves)"


def _beside_lines(inv: InvarianceResult) -> list[str]:
    return [line for v in inv.variants if (line := beside_line(v)) is not None]


BESIDE = ("With both arms, a candidate variant is judged against the reference's own moves: a prompt that "
          "moves with the reference (same first moved position, same batch-1 token there, the same variant "
          "tokens) is not counted against it; the reference's own moves are the yardstick, never a failure.")


def markdown_section(inv: InvarianceResult) -> list[str]:
    out = ["## Invariance", "", f"**{md(inv.verdict_line)}**: each variant's runs against the arm's own batch-1 "
           f"run, by the gate's comparator (band {inv.band} nats). Cost: the variant's serving time over the "
           "batch-1 run's (engine start-up excluded).", ""]
    out += ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(md(c) for c in row(v)) + " |" for v in inv.variants]
    out.append("")
    if beside := _beside_lines(inv):
        out += [md(BESIDE), "", *(f"- {md(line)}" for line in beside), ""]
    if spec := _speculative(inv):
        out += ["Speculative decoding, judged exactly (a lossless speculator flips not even a near-tie); counts "
                "as the engine reports them; mean accepted length: tokens per verification step, the "
                "verifier's own included.", "", "| " + " | ".join(SPEC_HEAD) + " |", "|" + "---|" * len(SPEC_HEAD)]
        out += ["| " + " | ".join(md(c) for c in speculation_row(v)) + " |" for v in spec] + [""]
    for v in inv.variants:
        if (listed := moves(v)) or v.problems:
            out += [f"### {md(v.arm)} {md(v.name)}", ""]
            out += [f"- problem: {md(p)}" for p in v.problems]
            out += [f"- `{md(m.id)}` (run {m.run}): {md(text)}" for m, text in listed[:MOVED_CAP]]
            if len(listed) > MOVED_CAP:
                out.append(f"- {len(listed) - MOVED_CAP} more in the JSON")
            out.append("")
    out += [f"- problem: {md(p)}" for p in inv.problems]
    return out


_STYLE = {VariantVerdict.PASS: "bold green", VariantVerdict.FAIL: "bold red", VariantVerdict.INCOMPLETE: "bold yellow",
          VariantVerdict.YARDSTICK: "bold cyan"}


def console_table(inv: InvarianceResult) -> Table:
    t = Table(title=Text("invariance", no_wrap=True), box=box.SIMPLE_HEAD, pad_edge=False, padding=0)
    one_arm = len({v.arm for v in inv.variants}) <= 1  # then the arm is said once, in the title
    if one_arm and inv.variants:
        t.title = Text(f"invariance ({inv.variants[0].arm})", no_wrap=True)
    heads = [h for h in HEAD if not (one_arm and h == "arm")]
    short = {"candidate": "cand", "reference": "ref"}  # the arm in few columns: the figures need them
    rows = [[visible(short.get(c, c) if i == 1 else c) for i, c in enumerate(row(v)) if not (one_arm and i == 1)]
            for v in inv.variants]
    for k, h in enumerate(heads):
        if h in ("variant", "arm"):  # a long name folds onto a second line where 80 columns are too few
            t.add_column(h, overflow="fold", min_width=min(len(h), 9))
        else:  # a figure is never cut ("128/…"): its column is fixed to its widest cell or header word
            t.add_column(h, width=max([len(r[k]) for r in rows] + [len(w) for w in h.split()]))
    for v, texts in zip(inv.variants, rows, strict=True):
        cells = [Text(c, no_wrap=heads[k] not in ("variant", "arm")) for k, c in enumerate(texts)]
        cells[1 if one_arm else 2].stylize(_STYLE[v.verdict])
        t.add_row(*cells)
    return t


def print_invariance(inv: InvarianceResult, console: Console) -> None:
    """The variants table, then the invariance verdict on its own line and what moved first."""
    console.print(console_table(inv))
    for v in _speculative(inv):
        cells = dict(zip(SPEC_HEAD, speculation_row(v)))
        console.print(Text(visible(f"  {v.name}: tokens {cells['tokens']}; drafted {cells['drafted']}, accepted "
                                   f"{cells['accepted']} ({cells['acceptance']}), mean accepted length "
                                   f"{cells['mean accepted length']}; time {cells['time (batch-1 run)']}")))
    console.print(Text.assemble((inv.lead.value.upper(), _STYLE[inv.lead]), f"  {visible(inv.verdict_line)}"))
    for line in _beside_lines(inv):
        console.print(Text(visible(f"  {line}")))
    for v in sorted(inv.variants, key=lambda v: v.verdict != VariantVerdict.FAIL):  # what moved first, as the line
        for p in v.problems[:2]:
            console.print(Text(visible(f"  {v.arm} {v.name}: {p}")))
        for m, text in moves(v)[:3]:
            console.print(Text(visible(f"  {v.arm} {v.name}: {m.id}: {text}")))


def _strip(m: Moved) -> str:
    """One cell per position: equal before the first divergence, the flip, then after it."""
    a, b = m.baseline_tokens, m.variant_tokens
    cells = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        cls = "m" if m.position is None or i < m.position else (
            ("t" if m.status == Status.NEAR_TIE else "d") if i == m.position else "a")
        title = f"{i}: batch-1 {x}" + ("" if x == y else f" · variant {y}")
        cells.append(f"<i class='{cls}' title='{escape(title)}'></i>")
    return f"<span class='strip'>{''.join(cells)}</span>"


def html_section(inv: InvarianceResult) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row(v)) + "</tr>" for v in inv.variants)
    strips = []
    for v in inv.variants:
        items = "".join(f"<li>{_strip(m)} <code>{escape(m.id)}</code> {escape(text)}</li>"
                        for m, text in moves(v)[:MOVED_CAP])
        probs = "".join(f"<li>problem: {escape(p)}</li>" for p in v.problems)
        if items or probs:
            strips.append(f"<h3>{escape(v.arm)} {escape(v.name)}</h3><ul>{probs}{items}</ul>")
    spec = _speculative(inv)
    if spec:
        shead = "".join(f"<th>{escape(h)}</th>" for h in SPEC_HEAD)
        srows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in speculation_row(v)) + "</tr>" for v in spec)
        rows += f"</table><table class='speed'><tr>{shead}</tr>{srows}"
    beside = "".join(f"<li>{escape(line)}</li>" for line in _beside_lines(inv))
    beside = f"<p class='none'>{escape(BESIDE)}</p><ul>{beside}</ul>" if beside else ""
    return (f"<h2 id='invariance'>Invariance</h2><p class='speedv {escape(inv.verdict.value)}'>"
            f"{escape(inv.verdict_line)}</p><p class='none'>Each variant against the arm's own batch-1 run; one "
            f"strip per prompt that moved (hover a cell for the tokens).</p><table class='speed'><tr>{head}</tr>"
            f"{rows}</table>{beside}{''.join(strips)}")


def junit_cases(suite: ET.Element, inv: InvarianceResult, cls: str) -> None:
    """One case per variant: a failure when it moved, an error when it did not run; under the
    informational policy both pass with the figures in system-out (it changes no exit code)."""
    for v in inv.variants:
        case = ET.SubElement(suite, "testcase", classname=cls, name=visible(f"invariance {v.arm} {v.name}"))
        lines = [*v.problems, *([line] if (line := beside_line(v)) else []), *(f"{m.id}: {t}" for m, t in moves(v))]
        why = visible("\n".join(lines) or v.verdict.value, keep_newlines=True)
        if inv.policy != InvariancePolicy.INFORMATIONAL and v.verdict == VariantVerdict.FAIL:
            ET.SubElement(case, "failure", message=visible(f"{v.name} moved")).text = why
        elif inv.policy != InvariancePolicy.INFORMATIONAL and v.verdict == VariantVerdict.INCOMPLETE:
            ET.SubElement(case, "error", message=visible(f"{v.name} incomplete")).text = why
        out = "\n".join([" | ".join(row(v)), *([" | ".join(speculation_row(v))] if v.exact else []),
                         *([why] if v.pairs is not None or v.verdict == VariantVerdict.YARDSTICK else [])])
        ET.SubElement(case, "system-out").text = visible(out, keep_newlines=True)


def _junit(inv: InvarianceResult, name: str) -> str:
    cls = visible(f"strict-gate.{name}")
    suite = ET.Element("testsuite", name=cls)
    junit_cases(suite, inv, cls)
    return suite_xml(suite)


def write_invariance_reports(inv: InvarianceResult, out_dir: Path, *, name: str) -> dict[str, Path]:
    """`strict-gate invariance`'s files; invariance.json last, so its presence means the set is whole."""
    inv = scrub_obj(inv)
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>strict-gate invariance: "
            f"{escape(name)}</title><style>{CSS}</style></head><body><main>{html_section(inv)}</main></body></html>\n")
    texts = {"md": "\n".join([f"# {md(name)}: invariance", "", *markdown_section(inv)]) + "\n",
             "html": page, "junit": _junit(inv, name)}
    written = {}
    for fmt, text in texts.items():
        written[fmt] = out_dir / FILES[fmt]
        write_text_atomic(written[fmt], visible(text, keep_newlines=True))
    doc = {"schema": INVARIANCE_SCHEMA, "name": name, "created": now_iso(), "invariance": inv.to_json()}
    written["json"] = out_dir / FILES["json"]
    write_text_atomic(written["json"], json.dumps(strict_json(doc), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    return written


def _console(r: GateResult, console: Console) -> None:
    if (inv := of(r)) is not None:
        print_invariance(inv, console)


def _show(report: ReportDoc, console: Console) -> None:
    """`show`: the variants as the gate printed them, read back from report.json."""
    if (sec := report.features.get("invariance")) is not None:
        print_invariance(load_invariance(sec.section), console)


def _cases(suite: ET.Element, r: GateResult, cls: str) -> None:
    if (inv := of(r)) is not None:
        junit_cases(suite, inv, cls)


SECTION = Section(
    "invariance",
    # its own line too: the invariance verdict never changes the token verdict
    markdown_head=lambda r: [] if (inv := of(r)) is None else [
        f"{md(inv.verdict_line)}; see Invariance below.", ""],
    markdown=lambda r, dec: [] if (inv := of(r)) is None else markdown_section(inv),
    html=lambda r: "" if (inv := of(r)) is None else html_section(inv),
    console=_console,
    junit_cases=_cases,
    show=_show,
)
