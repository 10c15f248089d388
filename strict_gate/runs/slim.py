"""What `compare` keeps of each record once its chunk is judged, in about 200 bytes of memory.

The reports and the judge still look records up after the comparison (token ids around a
divergence, timings, samples), so each run keeps a slim copy of every record: its small fields in
memory, its token ids (prompt, continuation, samples) in an unlinked temporary file (the spill:
4 bytes an id, gone with the process even if it is killed), its top-k read back from the run file
and audited again on first look. At 100,000 prompts x 512 tokens the ids alone were about 540 MiB
held; spilled, memory stays flat in the prompt count.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from strict_gate.runs.records import Record, TextReply, Timing, TopK


class DiskSteps(Sequence[TopK]):
    """A slim record's top-k, decoded from the run file (and audited again) on first look."""

    __slots__ = ("_load", "_n", "_steps")

    def __init__(self, n: int, load: Callable[[], Sequence[TopK]]):
        self._n, self._load = n, load
        self._steps: Sequence[TopK] | None = None

    def _loaded(self) -> Sequence[TopK]:
        if self._steps is None:
            self._steps = self._load()
        return self._steps

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self._loaded()[i]

    def __eq__(self, other) -> bool:
        return self._loaded() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DiskSteps({self._n} steps)"

    def lookup(self, tokens: Sequence[int]) -> list[float | None]:
        """Record.logprobs_at over the loaded steps (TopSteps.lookup where they are a run's arrays)."""
        return Record("", (), (), top_logprobs=self._loaded()).logprobs_at(tokens)


class Spill:
    """Id sequences appended to an unlinked temporary file, read back by offset (one pread)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="strict-gate-ids-")  # noqa: SIM115 (lives as long as the records)
        self._end = 0
        self._lock = threading.Lock()

    def put(self, seqs: Sequence[Sequence[int]]) -> int:
        """Where these sequences now start (int32: the audit bounds ids to 0..2**31-1)."""
        data = b"".join(np.asarray(s, dtype=np.int32).tobytes() for s in seqs)
        with self._lock:
            at, done = self._end, 0
            while done < len(data):  # a write may stop short; what it wrote is kept, the rest written after
                done += os.pwrite(self._file.fileno(), data[done:], at + done)
            self._end += len(data)
        return at

    def get(self, at: int, lengths: Sequence[int]) -> list[tuple[int, ...]]:
        data = os.pread(self._file.fileno(), 4 * sum(lengths), at)
        ids = np.frombuffer(data, dtype=np.int32).tolist()
        out, i = [], 0
        for n in lengths:
            out.append(tuple(ids[i : i + n]))
            i += n
        return out


@dataclass(frozen=True)
class Slim:
    """A record without its top-k, its ids in the spill: `lengths` are the prompt's, the
    continuation's and each sample's, in that order, from `at`."""

    at: int
    lengths: tuple[int, ...]
    finish_reason: str | None
    has_top: bool
    has_samples: bool
    error: str | None
    timing: Timing | None
    text_only: TextReply | None = None

    @classmethod
    def of(cls, r: Record, spill: Spill) -> Slim:
        seqs = [r.prompt_token_ids, r.token_ids, *(r.samples or ())]
        return cls(spill.put(seqs), tuple(len(s) for s in seqs), r.finish_reason, r.top_logprobs is not None,
                   r.samples is not None, r.error, r.timing, r.text_only)

    def record(self, rid: str, spill: Spill, load: Callable[[], Sequence[TopK]]) -> Record:
        prompt, tokens, *samples = spill.get(self.at, self.lengths)
        return Record(
            id=rid,
            prompt_token_ids=prompt,
            token_ids=tokens,
            finish_reason=self.finish_reason,
            top_logprobs=DiskSteps(len(tokens), load) if self.has_top else None,
            samples=tuple(samples) if self.has_samples else None,
            error=self.error,
            timing=self.timing,
            text_only=self.text_only,
        )
