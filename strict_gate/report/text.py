"""Decoding token ids for reviewers, and escaping model text so it cannot break a report."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strict_gate.core.redact import scrub_obj
from strict_gate.report.pieces import byte_level_bytes, continues, fallback_byte, readable, split_characters
from strict_gate.runs.records import Record

if TYPE_CHECKING:
    from strict_gate.judge.result import GateResult


def _tokenizer_file(tokenizer: str | None) -> Path | None:
    if not tokenizer:
        return None
    from strict_gate.core.model_files import find_tokenizer_json

    return find_tokenizer_json(tokenizer, Path.cwd())


class Decoder:
    """Decodes with the reference's tokenizer.json (the `tokenizers` library, no torch).

    Without a tokenizer, tokens show as <id>: the report stays correct, only less readable.
    A byte that is not part of a whole character shows as <0xE6> (report/pieces.py).
    """

    def __init__(self, *tokenizers: str | None):
        """Takes candidate locations (a tokenizer.json, a model dir, or `bundled:NAME`) and uses
        the first that exists here: a baseline made on another machine may name a path that
        does not exist on this one."""
        self._tok: Any = None
        self._byte_level = False
        self._added: dict[int, str] = {}
        for tokenizer in tokenizers:
            f = _tokenizer_file(tokenizer)
            if f is None:
                continue
            try:
                from tokenizers import Tokenizer, decoders

                self._tok = Tokenizer.from_file(str(f))
            except Exception:
                continue
            # Only a plain ByteLevel decoder makes a run's text exactly its pieces' bytes joined.
            self._byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)
            self._added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
            return

    @property
    def available(self) -> bool:
        return self._tok is not None

    def _bytes(self, token_id: int) -> bytes | None:
        """A token's bytes where the vocabulary says them (a byte-level piece, an added token of a
        byte-level vocabulary, a byte-fallback <0xNN> piece); None otherwise."""
        piece = self._tok.id_to_token(token_id)
        if (b := fallback_byte(piece)) is not None:
            return bytes([b])
        if not self._byte_level or piece is None:
            return None
        return self._added[token_id].encode("utf-8") if token_id in self._added else byte_level_bytes(piece)

    def text(self, ids) -> str:
        """A run of tokens as text: consecutive pieces joined into bytes before decoding, so a
        character split over tokens prints whole and only a byte outside a character as <0xNN>."""
        ids = list(ids)
        if self._tok is None:
            return "".join(f"<{i}>" for i in ids)
        if not self._byte_level and all(self._kind(t) == "text" for t in ids):
            return self._tok.decode(ids, skip_special_tokens=False)  # the whole run: its decoder's spacing kept
        out = []
        for kind, group in groupby(ids, key=self._kind):
            if kind == "bytes":
                out.append(readable(b"".join(self._bytes(t) or b"" for t in group)))
            elif kind == "text":  # the pieces of a vocabulary that is not byte-level
                out.append(self._tok.decode(list(group), skip_special_tokens=False))
            else:  # an id the vocabulary does not have: shown, never dropped
                out.append("".join(f"<{i}>" for i in group))
        return "".join(out)

    def _kind(self, token_id: int) -> str:
        if self._bytes(token_id) is not None:
            return "bytes"
        return "unknown" if self._tok.id_to_token(token_id) is None else "text"

    def tail(self, ids, width: int) -> str:
        """The text of the last `width` tokens, "…" where cut; the cut moves back over tokens
        that begin inside a character (at most 3), so the first character prints whole."""
        ids = list(ids)
        start = floor = max(0, len(ids) - width)
        while self._tok is not None and start > max(0, floor - 3) and continues(self._bytes(ids[start]) or b""):
            start -= 1
        return ("…" if start else "") + self.text(ids[start:])

    def within(self, ids, index: int) -> str:
        """The character(s) token `index` of a stream is a piece of, completed by its neighbours
        (a character spans 4 tokens at most); "" where the token holds whole characters only."""
        if self._tok is None or not 0 <= index < len(ids):
            return ""
        lo, hi = index, index + 1
        while lo > max(0, index - 3) and self._bytes(ids[lo - 1]) is not None:
            lo -= 1
        while hi < min(len(ids), index + 4) and self._bytes(ids[hi]) is not None:
            hi += 1
        parts = [self._bytes(t) or b"" for t in ids[lo:hi]]
        start = sum(len(b) for b in parts[: index - lo])
        return split_characters(b"".join(parts), start, start + len(parts[index - lo]))

    @lru_cache(maxsize=4096)  # noqa: B019 (a Decoder lives for one report; the cache is the point)
    def token(self, token_id: int | None) -> str:
        """One token's text; a byte-level piece of a multi-byte character shows as its bytes
        (<0xE6><0x80>), never as an unreadable replacement character or a \\x escape."""
        if token_id is None:
            return "(end)"
        if self._tok is None:
            return f"<{token_id}>"
        text = self.text([token_id])
        if not text:
            text = self._tok.id_to_token(token_id) or f"<{token_id}>"
        return _cell(text)


def gate_decoder(r: GateResult) -> Decoder:
    """The decoder of one gate: the reference's tokenizer, else the candidate's. Built once and
    handed to every format that decodes, so a gate loads its tokenizer once, not once a format.
    The names are scrubbed as every report scrubs them, so the raw result and the scrubbed one
    build the same decoder (the gate builds it before the writers scrub)."""
    return Decoder(*(scrub_obj(arm.tokenizer) for arm in (r.reference, r.candidate)))


def _cell(text: str) -> str:
    """Control characters (a newline, DEL) and other invisible ones (U+00A0) as escapes: one
    token must stay one visible cell."""
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    """\\n, \\x1b below 0x80; \\u00a0 above, so that \\xNN never reads as a byte (bytes are <0xNN>)."""
    n = ord(c)
    return repr(c)[1:-1] if n < 0x80 else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


_MD_SPECIAL = str.maketrans(
    {
        "\\": "\\\\",
        "|": "\\|",
        "`": "&#96;",
        "*": "\\*",
        "_": "\\_",
        "[": "\\[",
        "]": "\\]",
        "#": "&#35;",
        "\n": "↵",
        "\r": "␍",
        "\t": "⇥",
    }
)


def md(text: str) -> str:
    """Escape model text for a markdown table cell: no pipes, code spans, HTML, newlines or
    control characters survive."""
    return visible(html.escape(text, quote=False).translate(_MD_SPECIAL))


# C0 (but newline, where asked), DEL, C1, lone surrogates, the two non-characters XML forbids, and
# the line separators and bidi overrides that would move or reorder a report's text around them.
_INVISIBLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_INVISIBLE_OR_NEWLINE = re.compile("[\n" + _INVISIBLE.pattern[1:])


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x80 else f"\\u{c:04x}"  # \u0085, never \x85: bytes are <0xNN>


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """Control characters as visible escapes (ESC -> \\x1b), so ids, model text and engine
    errors can neither drive a terminal nor break a report; newlines stay when they are structure."""
    return (_INVISIBLE if keep_newlines else _INVISIBLE_OR_NEWLINE).sub(_escape_char, text)


def part_of(dec: Decoder, token_id: int, before: Sequence[int] = (), after: Sequence[int] = ()) -> str:
    """The character a piece of one makes with the tokens around it (ж for B6 after D0), or ""."""
    head = list(before[-3:])
    return _cell(dec.within([*head, token_id, *after[:3]], len(head)))


def show_token(dec: Decoder, token_id: int | None, before: Sequence[int] = (), after: Sequence[int] = ()) -> str:
    """A token as a reviewer reads it: its text in quotes and its id; a piece of a character
    adds the character the tokens around it make of it (“<0xB6>” (131) in “ж”)."""
    if token_id is None:
        return "(end)"
    part = part_of(dec, token_id, before, after)
    return f"“{dec.token(token_id)}” ({token_id})" + (f" in “{part}”" if part else "")


def around(rec: Record | None, position: int | None) -> tuple[list[int], list[int]]:
    """One side's ids before a position (its prompt's included) and after it: the tokens that
    complete a piece of a character at that position; none for a missing or failed record."""
    if rec is None or rec.error is not None or position is None:
        return [], []
    return [*rec.prompt_token_ids, *rec.token_ids[:position]], list(rec.token_ids[position + 1 :])


_SURROGATE = re.compile("[\ud800-\udfff]")


def strict_json(obj: Any) -> Any:
    """NaN and infinities as null (strict JSON parsers, most CI tools, reject them), and a lone
    surrogate (an engine's "\\ud800") as visible text, since no UTF-8 file can hold it."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, str):
        return obj.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(obj) else obj
    if isinstance(obj, dict):
        return {strict_json(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj
