"""A chunk of records decoded without one Python object per top-k pair, or not at all.

A 512 x top-20 record holds 20,480 numbers in its top-k. Decoding them as tuples of Python
ints and floats (what read_records does) costs more than reading the whole file, so here each
line is decoded by msgspec with its top-k left as raw JSON text (`msgspec.Raw`: msgspec still
checks the line is valid JSON, every number included), and the numbers are read from that text
by Arrow's CSV reader in one C++ pass: with "]" deleted and "[" made a line break, a plain top-k
is one `id,lp,` row per pair. Arrow reads ids as int64 (a fraction or an exponent is no int64)
and logprobs with its correctly rounded parser, as msgspec does, straight into the arrays the
audit and the judge use.

This path only ever accepts the plain shape every writer uses, `[[[id,lp],[id,lp],...],...]`
with no whitespace, one step per token, the same width at every step of a record, integer ids
and finite logprobs, and then yields exactly the arrays the exact path yields. Anything else
(another shape, a float or exponent where an id is, an id beyond int64, a logprob written as the
integer -0, a line that does not decode) returns None and the caller decodes the chunk the exact
way, whose messages name the rule, the file and the line.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec
import numpy as np

from strict_gate.runs.audit import StepTable
from strict_gate.runs.reader import _RAW_TOP_DECODER, _Columns

_NULL = b"null"
_NO_TOP = msgspec.Raw(_NULL)
_NUMBER = b"0123456789-+.eE"  # what a JSON number is written with; the rest of a top-k is separators
_ROWS = bytes.maketrans(b"[", b"\n")  # with "]" deleted: "[[1,-0.5],[2,-0.7]]" -> "\n\n1,-0.5,\n2,-0.7"


@lru_cache(maxsize=8)
def _shape(steps: int, width: int) -> bytes:
    """The separators of `steps` steps of `width` pairs, in order: a plain top-k less its numbers."""
    step = b"[" + b",".join([b"[,]"] * width) + b"]"
    return b"[" + b",".join([step] * steps) + b"]"


def _width(steps: int, separators: int) -> int | None:
    """The width a record's separator count implies for `steps` steps, or None (no plain shape)."""
    if steps <= 0:
        return None
    per_step, rest = divmod(separators - 1 - 2 * steps, 4 * steps)
    return per_step if rest == 0 and per_step > 0 else None


@lru_cache(maxsize=1)
def _csv_options() -> tuple:
    """Arrow's CSV reader told the rows' one format: no header, no quotes, no nulls, blank lines
    (the "[" of steps) skipped, the empty third column (after each row's ",") never converted."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    read = pcsv.ReadOptions(column_names=["id", "lp", "end"], use_threads=False, block_size=1 << 24)
    parse = pcsv.ParseOptions(quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=True)
    convert = pcsv.ConvertOptions(column_types={"id": pa.int64(), "lp": pa.float64()}, include_columns=["id", "lp"],
                                  null_values=[], strings_can_be_null=False, quoted_strings_can_be_null=False)
    return read, parse, convert


def _widths(texts: list[bytes], steps: list[int]) -> list[int] | None:
    """Each record's width, or None when any record's separators are not the plain shape's."""
    widths = []
    for text, n in zip(texts, steps):
        seps = text.translate(None, _NUMBER)
        w = _width(n, len(seps))
        if w is None or seps != _shape(n, w):
            return None
        widths.append(w)
    return widths


def _numbers(texts: list[bytes], pairs: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Every pair's id and logprob, in order, or None when a number is no int64 id or no double."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rows = b",".join(texts).translate(_ROWS, b"]") + b","
    try:
        table = pcsv.read_csv(pa.py_buffer(rows), *_csv_options())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != pairs or table.column("id").null_count or table.column("lp").null_count:
        return None
    ids = table.column("id").to_numpy().astype(np.int64, copy=False)
    return ids, table.column("lp").to_numpy().astype(np.float64, copy=False)


def topk_arrays(texts: list[bytes], steps: list[int]) -> tuple[StepTable, np.ndarray] | None:
    """The top-k of these records (raw JSON text each, `steps` tokens each) as one StepTable
    and each record's width; None when any text is not in the plain shape or a number would
    not read exactly as msgspec reads it."""
    widths = _widths(texts, steps)
    if widths is None:
        return None
    got = _numbers(texts, sum(n * w for n, w in zip(steps, widths)))
    if got is None:
        return None
    ids, lps = got
    if not np.isfinite(lps).all() or (np.signbit(lps) & (lps == 0)).any():
        return None  # out of range (msgspec refuses it), or "-0": msgspec reads the integer as 0.0
    width = np.repeat(np.array(widths, dtype=np.int64), steps)
    return StepTable.from_flat(ids, np.ascontiguousarray(lps), width), np.array(widths)


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
