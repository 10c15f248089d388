"""Decoding token ids for reviewers, and escaping model text so it cannot break a report."""

from __future__ import annotations

import html
from functools import lru_cache
from pathlib import Path


def _tokenizer_file(tokenizer: str | None) -> Path | None:
    if not tokenizer:
        return None
    if tokenizer.startswith("bundled:"):
        from strict_gate.engines.base import BUNDLED_DIR

        tokenizer = str(BUNDLED_DIR / tokenizer[len("bundled:"):])
    p = Path(tokenizer)
    f = p / "tokenizer.json" if p.is_dir() else p
    return f if f.is_file() else None


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

    @lru_cache(maxsize=4096)
    def token(self, token_id: int | None) -> str:
        if token_id is None:
            return "(end)"
        if self._tok is None:
            return f"<{token_id}>"
        return self._tok.decode([token_id], skip_special_tokens=False)


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
    """Escape model text for a markdown table cell: no pipes, code spans, HTML or newlines survive."""
    return html.escape(text, quote=False).translate(_MD_SPECIAL)


def show_token(dec: Decoder, token_id: int | None) -> str:
    """A token as a reviewer reads it: its text in quotes and its id."""
    if token_id is None:
        return "(end)"
    return f"“{dec.token(token_id)}” ({token_id})"
