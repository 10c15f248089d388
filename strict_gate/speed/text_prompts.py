"""Ladder prompts for a text-only arm: real text cut to the rung's length in tokens.

A text-only server takes text, not ids, so the synthesised ids of the ladder (ladder.py's
TokenSpace) cannot be sent to it, and their decoded text would not tokenize back to the same
ids or length. Instead each prompt is a window of the gate's own prompt texts (the pool, all of
them tokenized and joined), decoded to text and tokenized again: both arms get that text's ids
(the token-id arm) or the text itself (the text-only arm). The window is widened or narrowed
until the text tokenizes to the rung's length; where a few tries do not land on it exactly
(a merge at the window's edges), the closest is kept and its real length is what is timed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TRIES = 8


@cache
def _tokenizer(path: str) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


@dataclass(frozen=True)
class TextSpace:
    """The pool's ids (special tokens left out) and the tokenizer that reads them back."""

    tokenizer: str
    pool: tuple[int, ...]
    specials: int  # ids the tokenizer adds to any text (a BOS)

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(_tokenizer(self.tokenizer).encode(text).ids)

    def draw(self, seed: str, n: int) -> tuple[tuple[int, ...], str]:
        """(ids, text) of about n tokens, seeded: the same for both arms and every run."""
        rng = random.Random(seed)
        start = rng.randrange(len(self.pool))
        k = max(1, n - self.specials)
        best: tuple[tuple[int, ...], str] | None = None
        for _ in range(TRIES):
            window = [self.pool[(start + i) % len(self.pool)] for i in range(k)]
            text = _tokenizer(self.tokenizer).decode(window, skip_special_tokens=True).strip() or "."
            ids = self._encode(text)
            if best is None or abs(len(ids) - n) < abs(len(best[0]) - n):
                best = (ids, text)
            if len(ids) == n:
                break
            k = max(1, k + n - len(ids))
        assert best is not None
        return best


def text_space(tokenizer: Path | None, texts: list[str]) -> TextSpace | None:
    """The pool of `texts` read with `tokenizer` (a tokenizer.json), None without either."""
    if tokenizer is None or not texts:
        return None
    tok = _tokenizer(str(tokenizer))
    pool: list[int] = []
    for t in texts:
        pool.extend(tok.encode(t, add_special_tokens=False).ids)
    specials = len(tok.encode("").ids)
    return TextSpace(str(tokenizer), tuple(pool), specials) if pool else None
