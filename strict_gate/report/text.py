"""Decoding token ids for reviewers, and escaping model text so it cannot break a report."""

from __future__ import annotations

import html
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2 byte-level BPE's printable stand-ins for the 256 byte values, reversed."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


_BYTE_OF = _byte_level_alphabet()


def _byte_level_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level BPE vocabulary entry stands for, or None for other vocabularies."""
    if not all(c in _BYTE_OF for c in piece):
        return None
    return bytes(_BYTE_OF[c] for c in piece)


def _tokenizer_file(tokenizer: str | None) -> Path | None:
    if not tokenizer:
        return None
    from strict_gate.core.model_files import find_tokenizer_json

    return find_tokenizer_json(tokenizer, Path.cwd())


class Decoder:
    """Decodes with the reference's tokenizer.json (the `tokenizers` library, no torch).

    Without a tokenizer, tokens show as <id>: the report stays correct, only less readable.
    """

    def __init__(self, *tokenizers: str | None):
        """Takes candidate locations (a tokenizer.json, a model dir, or `bundled:NAME`) and uses
        the first that exists here: a baseline made on another machine may name a path that
        does not exist on this one."""
        self._tok = None
        for tokenizer in tokenizers:
            f = _tokenizer_file(tokenizer)
            if f is None:
                continue
            try:
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_file(str(f))
                return
            except Exception:
                continue

    @property
    def available(self) -> bool:
        return self._tok is not None

    def text(self, ids) -> str:
        ids = list(ids)
        if self._tok is None:
            return "".join(f"<{i}>" for i in ids)
        return self._tok.decode(ids, skip_special_tokens=False)

    @lru_cache(maxsize=4096)  # noqa: B019 (a Decoder lives for one report; the cache is the point)
    def token(self, token_id: int | None) -> str:
        """One token's text; a byte-level piece of a multi-byte character shows as its bytes
        (\\xe6\\x9c) rather than as an unreadable replacement character."""
        if token_id is None:
            return "(end)"
        if self._tok is None:
            return f"<{token_id}>"
        text = self._tok.decode([token_id], skip_special_tokens=False)
        if not text or "\ufffd" in text:
            piece = self._tok.id_to_token(token_id)
            if piece is None:
                return f"<{token_id}>"
            raw = _byte_level_bytes(piece)
            text = raw.decode("utf-8", errors="backslashreplace") if raw is not None else piece
        # Control characters (a newline, DEL) show as escapes: one token must stay one visible cell.
        return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


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


# C0 (but newline, where asked), DEL, C1, lone surrogates and the two non-characters XML forbids.
_INVISIBLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_INVISIBLE_OR_NEWLINE = re.compile("[\n" + _INVISIBLE.pattern[1:])


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """Control characters as visible escapes (ESC -> \\x1b), so ids, model text and engine
    errors can neither drive a terminal nor break a report; newlines stay when they are structure."""
    return (_INVISIBLE if keep_newlines else _INVISIBLE_OR_NEWLINE).sub(_escape_char, text)


def show_token(dec: Decoder, token_id: int | None) -> str:
    """A token as a reviewer reads it: its text in quotes and its id."""
    if token_id is None:
        return "(end)"
    return f"“{dec.token(token_id)}” ({token_id})"


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
