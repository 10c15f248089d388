"""report.html, one prompt: its agreement strip and its side-by-side detail.

Every string that comes from a run (ids, token text, engine errors) goes through escape();
a hover shows the tokens through the title attribute, so the page needs no script.
"""

from __future__ import annotations

import html
from functools import lru_cache

from strict_gate.judge.compare import PromptComparison, Status
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.report.gaps import gap_cells
from strict_gate.report.text import Decoder, around, part_of, show_token, visible
from strict_gate.runs.records import Record, TopK

PROMPT_TAIL = 240  # characters of the decoded prompt shown before the continuations


def escape(text: str, *, keep_newlines: bool = False) -> str:
    """HTML-escaped, control characters shown as escapes (a browser would drop or garble them)."""
    return html.escape(visible(text, keep_newlines=keep_newlines))


def num(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def anchor(pid: str) -> str:
    """A fragment id for a prompt: ids may hold any text, so it is the escaped id itself."""
    return "p-" + escape(pid).replace(" ", "_")


def _tokens(rec: Record | None) -> tuple[int, ...]:
    return () if rec is None or rec.error is not None else tuple(rec.token_ids)


def shown(dec: Decoder, t: int) -> str:
    """A token's text; one made only of spaces shows them as ␣, or its chip would look empty."""
    text = dec.token(t)
    return text.replace(" ", "␣") if text and not text.strip(" ") else text


@lru_cache(maxsize=4096)  # bounded: a cache of every id in a vocabulary would be memory in itself
def _chip_text(dec: Decoder, t: int) -> str:
    """A token's chip, escaped: drawn once per id, not once per position (500 prompts x 512)."""
    return escape(shown(dec, t))


def _tok(dec: Decoder, t: int | None) -> str:
    return "(end)" if t is None else f"“{dec.token(t)}” ({t})"


@lru_cache(maxsize=4096)  # bounded: a cache of every id in a vocabulary would be memory in itself
def _tok_text(dec: Decoder, t: int | None) -> str:
    """_tok escaped, once per id (an agreement strip draws a title per position)."""
    return escape(_tok(dec, t))


def cell_class(p: PromptComparison, i: int) -> str:
    """m: equal before the divergence; t / d: the divergence, near-tie or not; a: after it."""
    d = p.first_divergence
    if d is None or i < d.position:
        return "m"
    if i == d.position:
        return "t" if p.status == Status.NEAR_TIE else "d"
    return "a"


def strip(p: PromptComparison, dec: Decoder, ref: Record | None, cand: Record | None) -> str:
    """One cell per position; the title holds both tokens, so a hover reads them."""
    R, C = _tokens(ref), _tokens(cand)
    cells = []
    for i in range(p.positions):
        r = R[i] if i < len(R) else None
        c = C[i] if i < len(C) else None
        title = f"{i}: reference {_tok_text(dec, r)}" + ("" if r == c else f" · candidate {_tok_text(dec, c)}")
        cells.append(f"<i class='{cell_class(p, i)}' title='{title}'></i>")
    return f"<span class='strip'>{''.join(cells)}</span>"


def _chips(label: str, tokens: tuple[int, ...], rec: Record | None, p: PromptComparison, dec: Decoder) -> str:
    out = []
    head = list(around(rec, 0)[0][-3:])  # the prompt's last ids: what a first piece may continue
    stream = [*head, *tokens]
    lps = rec.logprobs_at(tokens) if rec is not None else [None] * len(tokens)
    for i, t in enumerate(tokens):
        lp = lps[i]
        k = len(head) + i
        part = part_of(dec, t, stream[max(0, k - 3) : k], stream[k + 1 : k + 4]) if dec.available else ""
        title = f"{i}: id {t}, logprob {num(lp)}" + (f", in “{escape(part)}”" if part else "")  # digits need none
        out.append(f"<span class='chip {cell_class(p, i)}' title='{title}'>{_chip_text(dec, t)}</span>")
    if not tokens:
        out.append("<span class='none'>no tokens</span>")
    return f"<div class='chips'><b>{label}</b>{''.join(out)}</div>"


def topk_table(label: str, top: TopK | None, ref_tok: int | None, cand_tok: int | None, dec: Decoder,
               before: list[int]) -> str:
    """One side's top-k at the divergence, the two contested tokens marked; a piece of a
    character shows the character it makes after `before` (the side's ids up to there)."""
    if not top:
        return f"<div class='topk'><b>{label} top-k</b><p class='none'>no logprobs at this step</p></div>"
    rows = []
    for t, lp in top:
        mark = "rt" if t == ref_tok else "ct" if t == cand_tok else ""
        part = part_of(dec, t, before)
        text = escape(shown(dec, t)) + (f" <small>in “{escape(part)}”</small>" if part else "")
        rows.append(f"<tr class='{mark}'><td>{text}</td><td>{t}</td><td>{lp:.4f}</td></tr>")
    return (f"<div class='topk'><b>{label} top-{len(top)}</b><table><tr><th>token</th><th>id</th>"
            f"<th>logprob</th></tr>{''.join(rows)}</table></div>")


def _diagnosis(dg: Diagnosis | None, rescored_by: str | None) -> str:
    if dg is None:
        return ""
    if dg.error is not None:
        return f"<p class='diag'><b>teacher-forced:</b> re-scoring failed: {escape(dg.error)}</p>"
    return (f"<p class='diag'><b>teacher-forced</b> ({escape(rescored_by or 'the reference')}): "
            f"{escape(dg.verdict)} (decode gap {num(dg.decode_gap)})</p>")


def detail(
    p: PromptComparison,
    dec: Decoder,
    ref: Record | None,
    cand: Record | None,
    dg: Diagnosis | None,
    *,
    reason: str,
    rescored_by: str | None = None,
    drift_html: str = "",
) -> str:
    """Both continuations as token chips, the divergence marked, both top-k, gaps, diagnosis, text."""
    d = p.first_divergence
    head = (f"<h3 id='{anchor(p.id)}'>{escape(p.id)} <span class='st {p.status}'>{p.status}</span>"
            + ("" if d is None else f" at position {d.position}") + "</h3>")
    parts = [head, f"<p class='why'>{escape(reason)}</p>"]
    R, C = _tokens(ref), _tokens(cand)
    if R or C:
        parts.append(_chips("reference", R, ref, p, dec) + _chips("candidate", C, cand, p, dec))
    if d is not None:
        (rb, ra), (cb, ca) = around(ref, d.position), around(cand, d.position)
        gaps = gap_cells(d)
        parts.append(
            f"<p class='gaps'>reference {escape(show_token(dec, d.reference_token, rb, ra))} vs candidate "
            f"{escape(show_token(dec, d.candidate_token, cb, ca))}: reference gap <b>{escape(gaps[0])}</b>, candidate gap "
            f"<b>{escape(gaps[1])}</b>, reference margin {num(d.reference_margin)} nats</p>"
        )
        parts.append("<div class='tops'>"
                     + topk_table("reference", d.reference_top, d.reference_token, d.candidate_token, dec, rb)
                     + topk_table("candidate", d.candidate_top, d.reference_token, d.candidate_token, dec, cb)
                     + "</div>")
    parts.append(_diagnosis(dg, rescored_by))
    parts.append(drift_html)
    source = ref if ref is not None else cand
    if source is not None and (R or C):
        prompt = dec.text(source.prompt_token_ids)
        prompt = ("…" + prompt[-PROMPT_TAIL:]) if len(prompt) > PROMPT_TAIL else prompt
        parts.append(
            "<div class='texts'>"
            f"<div><b>prompt (end)</b><pre>{escape(prompt, keep_newlines=True)}</pre></div>"
            f"<div><b>reference</b><pre>{escape(dec.text(R), keep_newlines=True)}</pre></div>"
            f"<div><b>candidate</b><pre>{escape(dec.text(C), keep_newlines=True)}</pre></div></div>"
        )
    return f"<section class='prompt'>{''.join(parts)}</section>"
