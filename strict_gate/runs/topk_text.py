"""A chunk of records decoded without one Python object per top-k pair, or not at all.

A 512 x top-20 record holds 20,480 numbers in its top-k. Decoding them as tuples of Python
ints and floats (what read_records does) costs more than reading the whole file, so here each
line is decoded by msgspec with its top-k left as raw JSON text (`msgspec.Raw`: msgspec still
checks the line is valid JSON, every number included), and the numbers are taken from that
text in bulk: the separators are found with numpy, the numbers cast by Arrow's parser (correctly
rounded, as msgspec's is), straight into the arrays the audit and the judge use.

This path only ever accepts the plain shape every writer uses, `[[[id,lp],[id,lp],...],...]`
with no whitespace, one step per token, the same width at every step of a record, integer ids
and finite logprobs, and then yields exactly the arrays the exact path yields. Anything else
(another shape, a float or exponent where an id is, a number outside the range Arrow or msgspec
read alike, a logprob written as the integer -0, a line that does not decode) returns None and
the caller decodes the chunk the exact way, whose messages name the rule, the file and the line.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec
import numpy as np

from strict_gate.runs.audit import StepTable
from strict_gate.runs.reader import _RAW_TOP_DECODER, _Columns

COMMA, OPEN, CLOSE, MINUS, ZERO = 44, 91, 93, 45, 48
_EXACT_INT = 2**53  # ids beyond this are left to the exact path (a float64 would round them)
_NULL = b"null"
_NO_TOP = msgspec.Raw(_NULL)
_IS_SEP = bytes(1 if chr(c) in ",[]" else 0 for c in range(256))  # translate tables: one C pass each
_SEP_AS_ZERO = bytes(ZERO if chr(c) in ",[]" else c for c in range(256))


@lru_cache(maxsize=8)
def _shape(steps: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The separators of `steps` steps of `width` pairs, in order, and the index of the
    separator each number follows ("[" before an id, "," before a logprob)."""
    step = b"[" + b",".join([b"[,]"] * width) + b"]"
    seps = np.frombuffer(b"[" + b",".join([step] * steps) + b"]", dtype=np.uint8)
    follows = np.flatnonzero(((seps[:-1] == OPEN) & (seps[1:] == COMMA)) | ((seps[:-1] == COMMA) & (seps[1:] == CLOSE)))
    return seps, follows


def _width(steps: int, separators: int) -> int | None:
    """The width a record's separator count implies for `steps` steps, or None (no plain shape)."""
    if steps <= 0:
        return None
    per_step, rest = divmod(separators - 1 - 2 * steps, 4 * steps)
    return per_step if rest == 0 and per_step > 0 else None


def topk_arrays(texts: list[bytes], steps: list[int]) -> tuple[StepTable, np.ndarray] | None:
    """The top-k of these records (raw JSON text each, `steps` tokens each) as one StepTable
    and each record's width; None when any text is not in the plain shape or a number would
    not read exactly as msgspec reads it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = bytearray().join(texts)
    arr = np.frombuffer(text, dtype=np.uint8)
    where = np.flatnonzero(np.frombuffer(text.translate(_IS_SEP), dtype=bool))
    bounds = np.cumsum([0] + [len(t) for t in texts])
    counts = np.diff(np.searchsorted(where, bounds))
    widths, shapes, follows, base = [], [], [], 0
    for n, count in zip(steps, counts.tolist()):
        w = _width(n, count)
        if w is None:
            return None
        seps, after = _shape(n, w)
        widths.append(w)
        shapes.append(seps)
        follows.append(after + base)
        base += count
    if not np.array_equal(arr[where], np.concatenate(shapes)):
        return None  # the separators are not those of the plain shape
    at = np.concatenate(follows)
    starts, ends = where[at] + 1, where[at + 1]
    if not (ends > starts).all():
        return None
    neg = arr[starts] == MINUS
    digits = np.frombuffer(text.translate(_SEP_AS_ZERO), dtype=np.uint8)  # separators read as leading zeros
    digits[starts[neg]] = ZERO  # and signs: the magnitudes are read, then negated
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), ends])
    strings = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(digits))
    try:
        values = pc.cast(strings, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # a token that is no number (true, null, a string)
    values = np.where(neg, -values, values)
    ids, lps = values[0::2], values[1::2]
    if not _plain_ids(ids, ends[0::2] - starts[0::2], neg[0::2], text, ends):
        return None
    if not np.isfinite(lps).all() or (np.signbit(lps) & (lps == 0)).any():
        return None  # out of range (msgspec refuses it), or "-0": msgspec reads the integer as 0.0
    width = np.repeat(np.array(widths, dtype=np.int64), steps)
    return StepTable.from_flat(ids.astype(np.int64), np.ascontiguousarray(lps), width), np.array(widths)


def _find_all(text: bytearray, letter: bytes) -> list[int]:
    """Where `letter` occurs (an exponent's; few in a plain top-k, so a C search beats a numpy pass)."""
    found, i = [], text.find(letter)
    while i >= 0:
        found.append(i)
        i = text.find(letter, i + 1)
    return found


def _plain_ids(ids: np.ndarray, lengths: np.ndarray, neg: np.ndarray, text: bytearray, ends: np.ndarray) -> bool:
    """Every id written as a JSON integer (what msgspec's int type takes): no fraction, no
    exponent. A fraction makes the text longer than the integer's digits; an exponent is found
    by its letter, which must sit in a logprob."""
    if not (np.abs(ids) < _EXACT_INT).all():
        return False
    mag = np.abs(ids)
    ndigits = np.searchsorted(10.0 ** np.arange(1, 17), mag, side="right") + 1
    if not np.array_equal(lengths, ndigits + neg):
        return False
    letters = np.array(_find_all(text, b"e") + _find_all(text, b"E"), dtype=np.int64)
    owner = np.searchsorted(ends, letters, side="right")  # the number each letter sits in
    return bool((owner % 2 == 1).all())


def is_null(raw: msgspec.Raw) -> bool:
    return bytes(raw) == _NULL


def bulk_columns(lines: list[bytes], linenos: list[int], expected: list[str]) -> _Columns | None:
    """The chunk with each top-k read from its text in bulk (topk_arrays); None when any
    line is not plain (then _exact_columns decodes it and names what is wrong, and where)."""
    raws = []
    texts: list[bytes] = []
    steps: list[int] = []
    has_top = np.zeros(len(lines), dtype=bool)
    for k, (line, rid) in enumerate(zip(lines, expected)):
        try:
            raw = _RAW_TOP_DECODER.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if raw.id != rid:
            return None
        if not is_null(raw.top_logprobs):
            has_top[k] = True
            text, n = bytes(raw.top_logprobs), len(raw.token_ids)
            if n == 0 and text != b"[]":
                return None
            if n:
                texts.append(text)
                steps.append(n)
        raw.top_logprobs = _NO_TOP
        raws.append(raw)
    if texts:
        got = topk_arrays(texts, steps)
        if got is None:
            return None
        table = got[0]
    else:
        table = StepTable.from_steps([])
    return _Columns(raws, list(linenos), table, has_top)
