"""The streamed reader's bulk top-k path (runs/topk_text.py) against hostile records.

It reads the plain shape `[[[id,lp],...],...]` from text in bulk and must give exactly the
arrays the exact path (msgspec, tuple by tuple) gives, or step aside: for every hostile top-k
below, `strict-gate compare` ends as the exact reader ends (the same rule, file and line, exit
2), never with other figures and never with a traceback. Runs are written in a temporary
working directory and read through relative paths, as a user runs compare.
"""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

from strict_gate.errors import InputError
from strict_gate.judge import compare_runs as compare_mod
from strict_gate.offline.compare import compare_run_dirs
from strict_gate.runs.reader import read_records
from strict_gate.runs.stream import _exact_columns
from strict_gate.runs.topk_text import bulk_columns as _fast_columns
from strict_gate.runs.topk_text import topk_arrays

TOKENS, TOP = 6, 4


def _record(i: int, top_text: str | None = None, **over) -> str:
    """A plain record; top_text replaces its top-k's JSON text verbatim when given."""
    ids = [[100 + 7 * k + s for k in range(TOP)] for s in range(TOKENS)]
    lps = [[-0.25 * (k + 1) - 0.01 * s for k in range(TOP)] for s in range(TOKENS)]
    rec = {"id": f"p{i}", "prompt_token_ids": [1, 2, 3], "token_ids": [row[0] for row in ids],
           "finish_reason": "length", "top_logprobs": [[[a, b] for a, b in zip(r, q)] for r, q in zip(ids, lps)]}
    rec.update(over)
    text = json.dumps(rec, separators=(",", ":"))
    if top_text is not None:
        start = text.index('"top_logprobs":') + len('"top_logprobs":')
        text = text[:start] + top_text + "}"
    return text


def _plain_top(i: int = 0) -> str:
    return json.dumps(json.loads(_record(i))["top_logprobs"], separators=(",", ":"))


def _write_run(d, lines: list[str], n: int) -> None:
    d.mkdir()
    (d / "records.jsonl").write_text("".join(line + "\n" for line in lines))
    (d / "manifest.json").write_text(json.dumps({
        "schema": "strict-gate/run@1", "status": "complete",
        "engine": {"kind": "synthetic", "model": None, "options": {}, "env": {}, "versions": {}, "tokenizer": None},
        "prompt_set": {"name": "t", "sha256": "5" * 64, "count": n, "ids": [f"p{i}" for i in range(n)]},
        "sampling": {"max_tokens": TOKENS, "top_logprobs": TOP, "temperature": 0.0},
        "created": "2026-12-06T00:00:00+00:00", "finished": "2026-12-06T00:00:01+00:00", "records": n, "runs": 1}))


def _exact_outcome(path):
    try:
        recs = read_records(path, max_tokens=TOKENS)
    except InputError as e:
        return ("error", str(e), e.line)
    return ("ok", {k: [list(s) for s in r.top_logprobs] for k, r in recs.items() if r.top_logprobs is not None})


HOSTILE = {
    "a float id": lambda t: t.replace("[[[100,", "[[[100.0,", 1),
    "an exponent id": lambda t: t.replace("[[[100,", "[[[1e2,", 1),
    "an upper-case exponent id": lambda t: t.replace("[[[100,", "[[[1E2,", 1),
    "an id beyond 2**53": lambda t: t.replace("[[[100,", "[[[9007199254740993,", 1),
    "an id beyond 64 bits": lambda t: t.replace("[[[100,", "[[[99999999999999999999,", 1),
    "a negative id": lambda t: t.replace("[[[100,", "[[[-100,", 1),
    "an id of minus zero": lambda t: t.replace("[[[100,", "[[[-0,", 1),
    "a logprob written as the integer -0": lambda t: t.replace(",-0.25]", ",-0]", 1),
    "a logprob out of float range": lambda t: t.replace(",-0.25]", ",-1e400]", 1),
    "a positive logprob": lambda t: t.replace(",-0.25]", ",0.5]", 1),
    "whitespace": lambda t: t.replace(",", ", ", 3),
    "a string for a number": lambda t: t.replace("[[[100,", '[[["100",', 1),
    "null for a logprob": lambda t: t.replace(",-0.25]", ",null]", 1),
    "true for an id": lambda t: t.replace("[[[100,", "[[[true,", 1),
    "an object for a pair": lambda t: t.replace("[[100,-0.25]", '[{"a":[1,2]}', 1),
    "a pair of three": lambda t: t.replace(",-0.25]", ",-0.25,1]", 1),
    "a pair of one": lambda t: t.replace("[100,-0.25]", "[100]", 1),
    "a ragged step": lambda t: t[: t.index("],[", t.index("]],[[")) ] + "]" + t[t.index("]],[[") + 1:],
    "a step too few": lambda t: "[" + t[t.index("]],[[") + 3:],
    "a step too many": lambda t: t[:-1] + "," + t[1: t.index("]],[[") + 2] + "]",
    "a pair at step depth": lambda t: t.replace("[[[100,-0.25]", "[[100,-0.25", 1).replace("]],[[", "],[[", 1),
    "an empty step": lambda t: t.replace("]],[[", "]],[],[[", 1)[:-1] + "]",
    "no top-k at all": lambda t: "[]",
    "an unsorted step": lambda t: t.replace("-0.25]", "-9.25]", 1),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_top_k_ends_as_the_exact_reader_ends(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", 2_000)  # a few records a chunk: the bad one mid-file
    lines = [_record(i) for i in range(8)]
    lines[5] = _record(5, HOSTILE[name](_plain_top(5)))
    from pathlib import Path

    _write_run(Path("ref"), [_record(i) for i in range(8)], 8)
    _write_run(Path("cand"), lines, 8)
    exact = _exact_outcome(Path("cand/records.jsonl"))
    if exact[0] == "error":
        with pytest.raises(InputError) as e:
            compare_run_dirs("ref", "cand")
        assert (str(e.value), e.value.line) == exact[1:], name
        assert e.value.line == 6 and e.value.path == "cand/records.jsonl"
    else:  # accepted by the exact path too: the same figures, whichever path read them
        result = compare_run_dirs("ref", "cand")
        got = {k: [list(s) for s in r.top_logprobs] for k, r in result.candidate_records.items()
               if r.top_logprobs is not None}
        assert got == exact[1], name


def test_hostile_top_k_never_passes_the_bulk_path():
    """Each hostile text is refused by the bulk path itself (None), not read into figures."""
    base = _plain_top()
    for name, spoil in HOSTILE.items():
        if name in ("an unsorted step", "a positive logprob", "a negative id", "an id of minus zero",
                    "an id beyond 2**53"):
            continue  # plain in shape, an int64 id: read in bulk, then judged by the audit (checked above)
        assert topk_arrays([spoil(base).encode()], [TOKENS]) is None, name


def test_an_id_beyond_2_53_reads_exactly_in_bulk():
    """Ids are read as int64, not through a double: 2**53 + 1 stays itself."""
    text = HOSTILE["an id beyond 2**53"](_plain_top()).encode()
    got = topk_arrays([text], [TOKENS])
    assert got is not None and int(got[0].ids[0, 0]) == 2**53 + 1


def _random_number(rng: random.Random) -> str:
    """A logprob as any JSON writer might spell it: repr, exponents, many digits, integers."""
    x = -abs(struct.unpack("d", struct.pack("Q", rng.getrandbits(62)))[0]) if rng.random() < 0.2 else \
        -rng.expovariate(1.0) * 10 ** rng.randint(-12, 2)
    style = rng.randrange(6)
    if style == 0:
        return repr(x)
    if style == 1:
        return f"{x:.20e}"
    if style == 2:
        return f"{x:.25f}"
    if style == 3:
        return f"{x:E}"
    if style == 4:
        return str(-rng.randint(0, 30)).replace("-0", "-1") if rng.random() < 0.5 else "-0.0"
    return f"{x:.17g}"


def test_random_numbers_read_as_msgspec_reads_them():
    """Arrow's parser and msgspec's give the same float64 for every spelling a writer uses
    (or the bulk path steps aside); ids of every size up to 2**31."""
    rng = random.Random(51)
    for trial in range(60):
        steps = []
        for _ in range(TOKENS):
            ids = rng.sample(range(2**31), TOP)
            steps.append("[" + ",".join(f"[{a},{_random_number(rng)}]" for a in ids) + "]")
        top = "[" + ",".join(steps) + "]"
        line = _record(trial, top).encode()
        exact = _exact_columns([line], [1], [f"p{trial}"], "x")
        fast = _fast_columns([line], [1], [f"p{trial}"])
        if fast is None:
            continue
        assert np.array_equal(fast.table.ids, exact.table.ids)
        lf, le = fast.table.lps, exact.table.lps
        assert np.array_equal(lf.view(np.int64), le.view(np.int64)), top  # bit for bit, signs of zero included


def test_plain_records_take_the_bulk_path():
    """What every writer writes is read in bulk (else the speed is silently lost)."""
    lines = [_record(i).encode() for i in range(3)]
    fast = _fast_columns(lines, [1, 2, 3], ["p0", "p1", "p2"])
    exact = _exact_columns(lines, [1, 2, 3], ["p0", "p1", "p2"], "x")
    assert fast is not None
    assert np.array_equal(fast.table.ids, exact.table.ids) and np.array_equal(fast.table.lps, exact.table.lps)
    assert list(fast.has_top) == list(exact.has_top)


def test_a_record_with_no_tokens_reads_as_the_exact_path_reads_it():
    """token_ids [] with top_logprobs [] (a prompt that produced nothing): no steps, a top-k
    present; with a step listed anyway, the exact path names the rule."""
    empty = _record(0, "[]", token_ids=[], finish_reason="stop").encode()
    fast = _fast_columns([empty], [1], ["p0"])
    exact = _exact_columns([empty], [1], ["p0"], "x")
    assert fast is not None and list(fast.has_top) == list(exact.has_top) == [True]
    assert fast.table.ids.size == exact.table.ids.size == 0
    stray = _record(0, "[[[1,-0.5]]]", token_ids=[], finish_reason="stop").encode()
    assert _fast_columns([stray], [1], ["p0"]) is None
    with pytest.raises(InputError, match="rule steps-match-tokens"):
        _exact_columns([stray], [1], ["p0"], "x")


def test_the_index_over_blocks_equals_a_line_by_line_reading(tmp_path, monkeypatch):
    """index_records reads the file in blocks into one buffer: blank lines, a last line with no
    newline, ids past the head and lines that span many blocks give the lines, offsets and ids
    a line-by-line reading gives."""
    import strict_gate.runs.stream as stream

    monkeypatch.chdir(tmp_path)
    rng = random.Random(5)
    for trial in range(200):
        monkeypatch.setattr(stream, "_BLOCK", rng.choice([1, 2, 3, 7, 64, 1 << 20]))
        monkeypatch.setattr(stream, "_HEAD", rng.choice([1, 5, 12, 4096]))
        parts = []
        for i in range(rng.randint(0, 6)):
            if rng.random() < 0.2:
                parts.append(rng.choice(["", " ", "\t ", "\x0b", " \r"]) + "\n")
            else:
                start = rng.choice(['{"id": "', '{"id":"', '{ "id":"'])
                parts.append(f'{start}r{i}", "prompt_token_ids": [1], "z": "{"x" * rng.randint(0, 40)}"}}\n')
        text = "".join(parts)
        if rng.random() < 0.3:
            text = text.rstrip("\n")
        path = tmp_path / "records.jsonl"
        path.write_text(text)
        want, offset = [], 0
        for lineno, line in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
            if line.strip():
                want.append((json.loads(line)["id"], offset, len(line), lineno))
            offset += len(line)
        idx = stream.index_records(path)
        got = list(zip(idx.ids, idx.offsets.tolist(), idx.lengths.tolist(), idx.lines.tolist()))
        assert got == want, text
