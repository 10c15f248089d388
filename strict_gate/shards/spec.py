"""Which prompts a shard runs: prompt k of the set (0-based, in the set's order) goes to shard
k mod N. Striding, not blocks, so a battery sorted by kind (short prompts first, long last)
spreads its cost over every shard; the order is rebuilt from the rule when shards are merged.

A shard's run directory is an ordinary run (strict-gate/run@1) whose manifest `prompt_set`
names the shard's own ids and, under `shard`, where it sits: {"index": I, "of": N, "count":
the whole set's size}; its sha256 is the whole set's, so shards of one set are recognised.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strict_gate.errors import InputError
from strict_gate.runs.prompts import PromptSet

SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based: a Kubernetes JOB_COMPLETION_INDEX, a Slurm array task id from --array=0-(N-1)
    of: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """ "I/N" with 0 <= I < N; anything else is bad input (exit 2)."""
        m = SPEC.match(text)
        if m is None:
            raise InputError(f"--shard must be I/N (0-based I < N, e.g. 0/4), got {text!r}")
        index, of = int(m.group(1)), int(m.group(2))
        if of < 1 or index >= of:
            raise InputError(f"--shard {text!r}: the index must be 0 <= I < N, and N >= 1")
        return cls(index, of)

    def ids(self, all_ids: Sequence[str]) -> list[str]:
        """This shard's prompts, in the set's order."""
        return [pid for k, pid in enumerate(all_ids) if k % self.of == self.index]

    def select(self, ps: PromptSet) -> PromptSet:
        """The shard's prompts as a prompt set: its own ids, the whole set's sha256 (by which the
        shards of one set are recognised)."""
        return PromptSet(ps.name, ps.path, tuple(p for k, p in enumerate(ps.prompts) if k % self.of == self.index),
                         ps.sha256)

    def describe(self, total: int) -> dict[str, Any]:
        """The manifest's `prompt_set.shard`."""
        return {"index": self.index, "of": self.of, "count": total}


def order(shard_ids: Sequence[Sequence[str]]) -> list[str]:
    """The whole set's ids in its order, from each shard's ids (shard I's k-th prompt was prompt
    k*N + I of the set)."""
    n = len(shard_ids)
    total = sum(len(ids) for ids in shard_ids)
    return [shard_ids[k % n][k // n] for k in range(total)]
