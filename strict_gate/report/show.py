"""`strict-gate show REPORT_DIR`: the side-by-side view of a finished gate, in the terminal.

It reads report.json (through judge/stored.py, every field it uses checked) for the verdict, the
divergences, the diagnosis and the speed arm, and the two run directories (reference/ and candidate/ in the report directory, else the paths
report.json names) for the full token sequences. No engine, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from strict_gate.errors import InputError
from strict_gate.judge.compare import Status
from strict_gate.judge.diagnose import without_later
from strict_gate.judge.policy import policy_words
from strict_gate.judge.schema import PromptDoc, ReportDoc
from strict_gate.judge.stored import load_report
from strict_gate.judge.tally import headline_text
from strict_gate.report.gaps import gap_text
from strict_gate.report.sections import in_order
from strict_gate.report.text import Decoder, around, show_token, visible
from strict_gate.runs.layout import ReportDir, RunDir
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Record

SHOWN = 10  # non-matching prompts shown without --prompt
_CELL = {"m": "on #1b4d2b", "t": "bold black on #d4a72c", "d": "bold white on #cf222e", "a": "dim"}


@dataclass(frozen=True)
class FinishedGate:
    """A finished gate as `show` reads it: report.json and both runs' records."""

    report: ReportDoc
    reference: Mapping[str, Record]
    candidate: Mapping[str, Record]
    decoder: Decoder


def _records(report_dir: Path, report: ReportDoc, role: str) -> Mapping[str, Record]:
    """The run in the report directory, else the one report.json names (a `compare --out`)."""
    here = report_dir / role
    named = getattr(report.runs, role)
    for d in (here, Path(named) if named is not None else None):
        if d is not None and RunDir(d).manifest.exists():
            return load_run(d, allow_incomplete=True).records
    raise InputError(f"no {role} run directory: neither {here} nor the path report.json names ({named})",
                     path=str(report_dir))


def load_gate(report_dir: str | Path) -> FinishedGate:
    d = Path(report_dir)
    path = ReportDir(d).report_json
    if not path.is_file():
        raise InputError("not a report directory: no report.json", path=str(d))
    report = load_report(path)
    dec = Decoder(report.engines.reference.tokenizer, report.engines.candidate.tokenizer)
    return FinishedGate(report, _records(d, report, "reference"), _records(d, report, "candidate"), dec)


def _kind(i: int, position: int | None, status: Status) -> str:
    if position is None or i < position:
        return "m"
    if i == position:
        return "t" if status == Status.NEAR_TIE else "d"
    return "a"


def _chips(tokens, dec: Decoder, position: int | None, status: Status) -> Text:
    text = Text()
    for i, t in enumerate(tokens):
        text.append(visible(dec.token(t)), style=_CELL[_kind(i, position, status)])
        text.append(" ")
    return text if tokens else Text("(no tokens)", style="dim")


def _top(top, ref_tok, cand_tok, dec: Decoder, before: list[int]) -> Text:
    if not top:
        return Text("no logprobs at this step", style="dim")
    text = Text()
    for t, lp in top:
        mark = " ◀ reference" if t == ref_tok else " ◀ candidate" if t == cand_tok else ""
        text.append(f"{lp:8.4f}  {visible(show_token(dec, t, before))}{mark}\n", style="bold" if mark else "")
    return text


def _g(x) -> str:
    return "n/a" if not isinstance(x, (int, float)) else f"{x:.4f}"


def prompt_view(gate: FinishedGate, entry: PromptDoc) -> Group:
    """One prompt: both continuations as coloured token chips, both top-k at the divergence,
    the gaps, the teacher-forced diagnosis and both decoded texts."""
    pid, status, fd = entry.id, entry.status, entry.first_divergence
    pos = fd.position if fd is not None else None
    ref, cand = gate.reference.get(pid), gate.candidate.get(pid)
    R = ref.token_ids if ref is not None and ref.error is None else ()
    C = cand.token_ids if cand is not None and cand.error is None else ()
    dec = gate.decoder
    head = Text.assemble((visible(pid), "bold"), f"  {status}", "" if pos is None else f" at position {pos}",
                         f"  ({entry.outcome})" if entry.outcome == "unverified" else "")
    parts: list[RenderableType] = [head, Text(visible(entry.reason or entry.detail or ""), style="dim")]
    side = Table(box=box.SIMPLE, expand=True, show_edge=False)
    side.add_column("reference", ratio=1)
    side.add_column("candidate", ratio=1)
    side.add_row(_chips(R, dec, pos, status), _chips(C, dec, pos, status))
    if fd is not None:
        rt, ct = fd.reference_token, fd.candidate_token
        side.add_row(_top(fd.reference_top, rt, ct, dec, around(ref, fd.position)[0]),
                     _top(fd.candidate_top, rt, ct, dec, around(cand, fd.position)[0]))
        parts.append(side)
        gaps = [gap_text(g, r.gap if r is not None else None)
                for g, r in ((fd.reference_gap, fd.reference_rescored), (fd.candidate_gap, fd.candidate_rescored))]
        parts.append(Text(f"reference gap {gaps[0]}, candidate gap {gaps[1]}, "
                          f"reference margin {_g(fd.reference_margin)} nats"))
    else:
        parts.append(side)
    dg = entry.diagnosis
    if dg is not None:
        verdict = without_later(dg.verdict or "", dg.later.summary if dg.later is not None else None)
        parts.append(Text(visible(f"teacher-forced: {verdict}" + (f": {dg.error}" if dg.error else ""))))
        if dg.later is not None:
            parts.append(Text(visible(f"after the flip ({dg.later.outcome}): {dg.later.summary}")))
    for section in in_order("show_prompt"):
        if (text := section(entry)) is not None:
            parts.append(Text(visible(text, keep_newlines=True)))
    texts = Table(box=box.SIMPLE, expand=True, show_edge=False)
    texts.add_column("reference text", ratio=1)
    texts.add_column("candidate text", ratio=1)
    texts.add_row(Text(visible(dec.text(R), keep_newlines=True)), Text(visible(dec.text(C), keep_newlines=True)))
    parts.append(texts)
    return Group(*parts)


def _heading(r: ReportDoc) -> str:
    """The verdict the gate's exit code says (report@3's `overall`), else the token verdict."""
    word, sep, rest = (r.overall or str(r.verdict)).partition(" (")
    return word.upper() + sep + rest


def show(report_dir: str | Path, prompt: str | None = None, console: Console | None = None,
         limit: int = SHOWN) -> None:
    """Print one prompt (any status), or the non-matching ones, `limit` at most, with a count, then
    the speed arm when the gate measured it."""
    console = console or Console()
    gate = load_gate(report_dir)
    r = gate.report
    prompts = r.prompts
    console.print(Text(visible(f"{_heading(r)}: {r.name} (policy {policy_words(r.policy)})"), style="bold"))
    for name, sec in sorted(r.features.items()):
        if sec.exit_code:  # the section that sets (or joins) the exit code, beside the token verdict
            console.print(Text(visible(f"{name}: {sec.verdict} (exit {sec.exit_code})")))
    s = r.summary
    flips = s.flips.flips() if s.flips is not None else None
    if counts := headline_text({str(k): v for k, v in s.counts.items()}, flips):
        console.print(Text(visible(f"prompts exact {s.prompts_exact}/{s.prompts_total}; {counts}")))
    if prompt is not None:
        entry = next((p for p in prompts if p.id == prompt), None)
        if entry is None:
            raise InputError(f"no prompt {prompt!r} in this report ({len(prompts)} prompts)", path=str(report_dir))
        console.print(prompt_view(gate, entry))
        return
    bad = [p for p in prompts if p.status != Status.MATCH]
    if not bad:
        console.print(f"all {len(prompts)} prompts match token for token")
    else:
        for entry in bad[:limit]:
            console.rule()
            console.print(prompt_view(gate, entry))
        console.rule()
        more = f"; {len(bad) - limit} more not shown: --prompt ID shows any one" if len(bad) > limit else ""
        console.print(f"{min(len(bad), limit)} of {len(bad)} non-matching prompt(s) shown{more}")
    for section in in_order("show"):
        section(r, console)


__all__ = ["FinishedGate", "load_gate", "prompt_view", "show"]
