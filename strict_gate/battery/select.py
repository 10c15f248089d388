"""Choosing N prompts: the largest expected chance of a flip, under a coverage constraint.

With prompts independent the battery's detection is 1 - prod(1 - P_i), which grows with every
P_i, so without constraints the best N are the N largest P_i. The constraint is a floor and a
ceiling per group (min_per_group prompts from every group that has them, at most
ceil(max_share * N) from any one); with an additive objective, filling every floor with the
group's best and then taking the best of the rest under the ceilings is optimal. Ties (equal
P, often 0 where a margin is far beyond sigma) go to the smaller smallest margin, then to a
hash of the seed and the id: the same pool, margins and seed always give the same battery.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strict_gate.errors import InputError


@dataclass(frozen=True)
class Candidate:
    id: str
    group: str
    p_flip: float  # at the selection scale
    smallest_margin: float


@dataclass(frozen=True)
class Coverage:
    min_per_group: int
    max_share: float

    def __post_init__(self) -> None:
        if self.min_per_group < 0:
            raise InputError(f"--min-per-group {self.min_per_group}: must be >= 0")
        if not 0 < self.max_share <= 1:
            raise InputError(f"--max-share {self.max_share!r}: must lie in (0, 1]")

    def cap(self, n: int) -> int:
        return max(1, math.ceil(self.max_share * n))

    def to_json(self) -> dict:
        return {"min_per_group": self.min_per_group, "max_share": self.max_share}


def default_coverage(n: int, groups: int, max_share: float = 0.5) -> Coverage:
    """A quarter of the battery spread evenly over the groups (at least one each when N allows)."""
    return Coverage(min_per_group=max(n // (4 * groups), 1 if n >= 2 * groups else 0), max_share=max_share)


def _rank_key(seed: int):
    def key(c: Candidate) -> tuple[float, float, str]:
        return (-c.p_flip, c.smallest_margin, hashlib.sha256(f"{seed}:{c.id}".encode()).hexdigest())

    return key


def check_feasible(sizes: Mapping[str, int], n: int, cov: Coverage) -> None:
    total = sum(sizes.values())
    if total < n:
        raise InputError(f"the pool holds {total} prompts, fewer than --size {n}")
    room = sum(min(s, cov.cap(n)) for s in sizes.values())
    if room < n:
        raise InputError(
            f"--max-share {cov.max_share} lets at most {cov.cap(n)} prompts come from each of the pool's "
            f"{len(sizes)} groups, {room} in all, fewer than --size {n}; raise --max-share or widen the pool"
        )
    if cov.min_per_group > cov.cap(n):
        raise InputError(f"--min-per-group {cov.min_per_group} is above the per-group ceiling {cov.cap(n)} "
                         f"(--max-share {cov.max_share} of {n})")
    floors = sum(min(s, cov.min_per_group) for s in sizes.values())
    if floors > n:
        raise InputError(
            f"--min-per-group {cov.min_per_group} over {len(sizes)} groups asks for {floors} prompts, "
            f"more than --size {n}; lower it"
        )


def select(candidates: Sequence[Candidate], n: int, coverage: Coverage, seed: int = 0) -> list[Candidate]:
    """The battery, best first."""
    if n < 1:
        raise InputError(f"--size {n}: must be >= 1")
    sizes = Counter(c.group for c in candidates)
    check_feasible(sizes, n, coverage)
    ranked = sorted(candidates, key=_rank_key(seed))
    chosen: list[Candidate] = []
    taken: Counter[str] = Counter()
    for c in ranked:  # every group's floor, from its best
        if taken[c.group] < coverage.min_per_group:
            chosen.append(c)
            taken[c.group] += 1
    picked = {c.id for c in chosen}
    cap = coverage.cap(n)
    for c in ranked:  # then the best of the rest, under the ceiling
        if len(chosen) == n:
            break
        if c.id not in picked and taken[c.group] < cap:
            chosen.append(c)
            taken[c.group] += 1
    return sorted(chosen, key=_rank_key(seed))
