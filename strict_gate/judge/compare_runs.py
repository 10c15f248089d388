"""Two runs compared prompt by prompt (judge/compare.py judges each prompt): in memory
(`compare_runs`) or streamed from disk a chunk at a time (`compare_on_disk`, for `strict-gate
compare` on 10,000 prompts with flat memory)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

from strict_gate.judge.compare import (
    DEFAULT_BAND,
    Comparison,
    PromptComparison,
    check_band,
    compare_prompt,
    summarize,
)
from strict_gate.judge.text_only import Decode
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE
from strict_gate.runs.prefetch import read_pairs
from strict_gate.runs.records import Record
from strict_gate.runs.stream import RunRecords

CHUNK_BYTES = 8 << 20  # records (both runs) decoded at once by compare_on_disk: bounds its memory


def _checked(band: float, greedy_tolerance: float) -> float:
    band = check_band(band)
    if not math.isfinite(greedy_tolerance) or greedy_tolerance < 0:
        raise ValueError(f"greedy_tolerance must be a finite number >= 0, got {greedy_tolerance!r}")
    return band


def _expected(reference: Mapping[str, Record], candidate: Mapping[str, Record]) -> list[str]:
    """Without a prompt set, every id seen in either run is expected (reference order first)."""
    return list(reference) + [i for i in candidate if i not in reference]


def compare_runs(
    reference: Mapping[str, Record],
    candidate: Mapping[str, Record],
    *,
    band: float = DEFAULT_BAND,
    prompt_ids: list[str] | None = None,
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE,
    decode: Decode | None = None,
) -> Comparison:
    """Compare two runs' records by prompt id. prompt_ids fixes the order and the expected set;
    without it, every id seen in either run is expected (reference order first)."""
    band = _checked(band, greedy_tolerance)
    if prompt_ids is None:
        prompt_ids = _expected(reference, candidate)
    prompts = tuple(
        compare_prompt(i, reference.get(i), candidate.get(i), band, greedy_tolerance, decode) for i in prompt_ids
    )
    return Comparison(band=band, prompts=prompts, summary=summarize(prompts))


def _chunks(ids: Iterable[str], reference: RunRecords, candidate: RunRecords) -> Iterator[list[str]]:
    """Prompt ids in order, cut where the records of both runs reach CHUNK_BYTES."""
    chunk: list[str] = []
    size = 0
    for i in ids:
        chunk.append(i)
        size += reference.size(i) + candidate.size(i)
        if size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def compare_on_disk(
    reference: RunRecords,
    candidate: RunRecords,
    *,
    band: float = DEFAULT_BAND,
    prompt_ids: list[str] | None = None,
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE,
    decode: Decode | None = None,
) -> Comparison:
    """compare_runs over two runs on disk, in bounded memory: a chunk of prompts at a time is
    decoded and audited (both runs, every record), compared, and let go. Each run keeps a slim
    copy of every record (a report reads a drawn prompt's top-k back from the file). Records of
    ids outside prompt_ids are audited too."""
    band = _checked(band, greedy_tolerance)
    order = _expected(reference, candidate) if prompt_ids is None else prompt_ids
    prompts: list[PromptComparison] = []
    for ids, refs, cands in read_pairs(reference, candidate, _chunks(order, reference, candidate)):
        for i in ids:
            pc = compare_prompt(i, refs.get(i), cands.get(i), band, greedy_tolerance, decode)
            prompts.append(pc)
            for got, run in ((refs, reference), (cands, candidate)):
                if i in got:
                    run.keep(got[i])
    expected = set(order)
    for run in (reference, candidate):
        rest = [i for i in run if i not in expected]
        for ids in _chunks(rest, run, run):
            for rec in run.read(ids).values():
                run.keep(rec)
    return Comparison(band=band, prompts=tuple(prompts), summary=summarize(prompts))
