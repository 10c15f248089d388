"""Token pieces as bytes, and bytes as text a reader can read.

A byte-level BPE vocabulary (GPT-2's alphabet: SmolLM2-135M, the bundled tiny-llama) holds
pieces that are part of a multi-byte UTF-8 character: 怎 is E6 80 8E, which SmolLM2 may emit
as 37911 (E6 80) then 236 (8E). Decoded alone such a piece is U+FFFD, and Python's
backslashreplace writes it \\xe6\\x80, which reads as an escaped string. Here every byte that is
not part of a whole character prints as <0xE6> (the notation llama.cpp and sentencepiece give
byte tokens), and a run of tokens is joined into bytes before it is decoded, so a character
split over two tokens prints whole.
"""

from __future__ import annotations

import re

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a byte-fallback vocabulary's byte piece
_LONE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte outside a character


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


def byte_level_bytes(piece: str) -> bytes:
    """The bytes a byte-level vocabulary entry stands for; a character outside the alphabet
    (never in a trained byte-level vocabulary) stands for its own UTF-8 bytes, as the
    tokenizers library decodes it."""
    return b"".join(bytes([_BYTE_OF[c]]) if c in _BYTE_OF else c.encode("utf-8") for c in piece)


def fallback_byte(piece: str | None) -> int | None:
    """The byte a byte-fallback piece (<0xE3>) stands for, else None."""
    m = BYTE_TOKEN.fullmatch(piece) if piece is not None else None
    return int(m.group(1), 16) if m else None


def readable(data: bytes) -> str:
    """UTF-8 text, each byte that is not part of a whole character as <0xNN> (never U+FFFD,
    never \\xNN): a partial character stays visible and cannot be mistaken for a real one."""
    text = data.decode("utf-8", "surrogateescape")
    return _LONE.sub(lambda m: f"<0x{ord(m.group()) - 0xDC00:02X}>", text)


def continues(data: bytes) -> bool:
    """Whether `data` starts inside a character (a UTF-8 continuation byte, 10xxxxxx)."""
    return bool(data) and data[0] & 0xC0 == 0x80


def split_characters(data: bytes, start: int, end: int) -> str:
    """The whole characters of `data` that bytes [start, end) are part of but do not hold
    whole: the character a piece of one belongs to (怎 for E6 80 in E6 80 8E)."""
    out, at = [], 0
    for c in data.decode("utf-8", "surrogateescape"):
        n = 1 if _LONE.match(c) else len(c.encode("utf-8"))
        if n > 1 and at < end and start < at + n and (at < start or end < at + n):
            out.append(c)
        at += n
    return "".join(out)
