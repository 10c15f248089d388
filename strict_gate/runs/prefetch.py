"""Both runs' records read a chunk ahead, in two threads, while the current chunk is compared.

Reading a chunk is mostly C work that lets the GIL go (Arrow's CSV reader takes each top-k's
numbers, numpy audits them), so the reference's and the candidate's chunks decode side by side
and the next pair decodes while this one is compared. At most two chunks of each run are held
(the one compared and the one read ahead): memory stays flat in the number of prompts. Errors
come out in the order a serial reader meets them: a chunk's reference before its candidate,
chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from strict_gate.runs.records import Record
from strict_gate.runs.stream import RunRecords

Pending = tuple[list[str], Future[dict[str, Record]], Future[dict[str, Record]]]


def read_pairs(reference: RunRecords, candidate: RunRecords,
               chunks: Iterable[list[str]]) -> Iterator[tuple[list[str], dict[str, Record], dict[str, Record]]]:
    """Each chunk's ids with both runs' records of them, decoded and audited."""
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="strict-gate-read")

    def ahead(ids: list[str] | None) -> Pending | None:
        return None if ids is None else (ids, pool.submit(reference.read, ids), pool.submit(candidate.read, ids))

    try:
        todo = iter(chunks)
        pending = ahead(next(todo, None))
        while pending is not None:
            ids, refs, cands = pending
            got = ids, refs.result(), cands.result()
            pending = ahead(next(todo, None))
            yield got
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
