"""Judging a text-only record (a server that answers text: docs/engine-protocol.md).

Such a record's token ids are the server's text tokenized in context by the arm's tokenizer,
and it carries no logprobs. What the judge can still say:
- whether the server read the prompt as the gate tokenized it: usage.prompt_tokens against the
  prompt's ids (a server that ignored the prompt, or added or dropped a BOS, feeds another
  count), and its /tokenize of the prompt text where it has one (prompt_problem);
- whether the text equals the reference's text (text_level): the reference's ids decoded in
  context by the same tokenizer. Equal text is a match, said as text-level, even where the
  re-tokenization differs from the reference's own ids (a model may emit a token split that
  the tokenizer would not produce from the text);
- at a difference, where the first differing token is: the comparator's divergence, which the
  reference re-scores on the candidate's prefix. The candidate's own gap stays unknown
  (TEXT_ONLY), so a two-sided policy keeps it divergent; policy near-tie-reference-only
  judges it from the reference's side alone (judge/policies/near_tie_reference_only.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Protocol

from strict_gate.runs.records import Record, Run

TEXT_ONLY = "text-only server"  # why a text-only candidate's own gap is unknown
Decode = Callable[[Sequence[int], Sequence[int]], str | None]  # (prompt ids, continuation ids) -> text
Spell = Callable[[Sequence[int]], bytes]  # ids -> the bytes they stand for, token by token (a special token: none)
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a byte-fallback token (sentencepiece)


def prompt_problem(rec: Record) -> str | None:
    """Why the server's own figures say it did not read the prompt the gate tokenized, or None."""
    return None if rec.text_only is None else rec.text_only.misread(rec.prompt_token_ids)


def text_level(ref: Record, cand: Record, decode: Decode | None) -> bool:
    """The candidate's text equals the reference's ids decoded in context, with the same finish."""
    if cand.text_only is None or decode is None or ref.finish_reason != cand.finish_reason:
        return False
    return decode(ref.prompt_token_ids, ref.token_ids) == cand.text_only.text


def strict_problem(ref: Record, cand: Record) -> str | None:
    """Why a text-level match is no token-for-token one (what strict judges), or None: the
    server's own count of generated tokens is not the reference's, or its text re-tokenises to
    other ids. Equal text is then all that is shown, and the ids the server never returned are
    not shown equal."""
    if cand.text_only is None:
        return None
    n, want = cand.text_only.usage_completion_tokens, len(ref.token_ids)
    if n is not None and n != want:
        return (f"text-level match only: the server's usage.completion_tokens says it generated {n} tokens and the "
                f"reference generated {want}: by its own count its ids are not the reference's, and strict judges "
                "token for token")
    if tuple(cand.token_ids) != tuple(ref.token_ids):
        k = next((i for i, (a, b) in enumerate(zip(ref.token_ids, cand.token_ids)) if a != b),
                 min(len(ref.token_ids), len(cand.token_ids)))
        return (f"text-level match only: its text re-tokenises to other ids than the reference's (from position {k}: "
                f"{len(cand.token_ids)} ids against {want}), and strict judges token for token (policy near-tie "
                "accepts equal text)")
    return None


def is_text_only(run: Run) -> bool:
    """A run made by a text-only arm (its engine options say so)."""
    return bool(run.manifest.engine.options.get("text_only"))


def run_decoder(run: Run) -> Decode | None:
    """Decoding in context with the text-only arm's tokenizer (named in its manifest), or None
    when the run is not text-only or the tokenizer is not on this machine (then only equal ids
    are a match)."""
    return decoder(_tokenizer_path(run))


def run_speller(run: Run) -> Spell | None:
    """The bytes of the text-only arm's ids (its tokenizer's), or None as run_decoder."""
    return speller(_tokenizer_path(run))


def _tokenizer_path(run: Run) -> Path | None:
    path = run.manifest.engine.tokenizer
    return Path(path) if is_text_only(run) and path else None


def decoder(path: Path | None) -> Decode | None:
    """Decoding in context with the tokenizer.json at `path`; None when there is none."""
    if path is None or not Path(path).is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))

    def decode(prompt: Sequence[int], continuation: Sequence[int]) -> str | None:
        head = tok.decode(list(prompt), skip_special_tokens=True)
        full = tok.decode(list(prompt) + list(continuation), skip_special_tokens=True)
        return full[len(head):] if full.startswith(head) else None

    return decode


def speller(path: Path | None) -> Spell | None:
    """The bytes ids stand for, with the tokenizer.json at `path`; None when there is none. Decoded
    text cannot tell splits of a half character apart (0xF0 and 0xEF 0xBF both decode to U+FFFD),
    so a re-split is held to the reply's bytes, never to its text alone."""
    if path is None or not Path(path).is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    byte_level = '"ByteLevel"' in json.dumps(json.loads(tok.to_str()).get("decoder"))
    specials = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    chars = _byte_level_chars()

    @cache
    def one(i: int) -> bytes:
        piece = tok.id_to_token(i)
        if i in specials or piece is None:
            return b""
        if m := _BYTE_PIECE.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        if byte_level and all(c in chars for c in piece):
            return bytes(chars[c] for c in piece)
        return piece.replace("\u2581", " ").encode()  # sentencepiece's word marker is a space

    return lambda ids: b"".join(one(i) for i in ids)


@cache
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet, char -> byte: printable bytes stand for themselves, the rest
    are moved to 256 + n in order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + n): b for n, b in enumerate(moved)}


class Judged(Protocol):
    """What the notes read of a judged prompt (judge/compare.py's PromptComparison), named here
    so that this module does not import the comparator that imports it."""

    @property
    def detail(self) -> str: ...
    @property
    def matched_positions(self) -> int: ...
    @property
    def reference_length(self) -> int: ...
    @property
    def candidate_length(self) -> int: ...


def text_only_notes(prompts: Sequence[Judged], cand: Run) -> tuple[str, ...]:
    """What a report says of a text-only candidate: what was and was not claimed."""
    text = [p for p in prompts if p.detail.startswith("text-level")]
    moved = sum(1 for p in text if p.matched_positions != p.reference_length or p.reference_length != p.candidate_length)
    decoded = "" if run_decoder(cand) is not None else (
        "; its tokenizer is not on this machine, so only equal ids were a match")
    return (f"the candidate is a text-only server (no token ids, no logprobs): {len(text)} prompt(s) matched at "
            f"text level, {moved} of them with other token ids than the reference's after tokenizing the text; "
            f"its own gap at any divergence is unknown{decoded}",)
