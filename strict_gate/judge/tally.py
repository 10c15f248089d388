"""The headline's counts of flips, each under its own name, for every format alike.

The comparator's status counts go by each prompt's first flip: a near-tie that diverges later
counts as a near-tie, and "divergent" holds both a gap beyond the band and a gap nobody knows (an
engine without top-k, a text-only server). The headline says them apart: `divergent` (a known
gap beyond the band, a token off the top-k, a refuted side), `gap unknown` (divergent only
because a side's gap is unknown), `later divergent` (positions after a first flip judged
divergent, judge/cascade.py) and `flipped positions` (every flip at every position: each
diverged prompt's first flip, the last position's too, and every later near-tie or divergence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strict_gate.judge.cascade import Cascade
from strict_gate.judge.compare import PromptComparison, Status, problems

FLIPPED = (Status.NEAR_TIE, Status.DIVERGENT)


@dataclass(frozen=True)
class Flips:
    """What the headline counts beside the comparator's statuses (the module docstring's names)."""

    divergent: int  # prompts whose first flip is divergent on a known gap
    gap_unknown: int  # prompts whose first flip is divergent only because a gap is unknown
    later_divergent: int  # positions after a first flip judged divergent
    prompts_later_divergent: int
    positions: int  # flipped positions, every position

    def to_json(self) -> dict:
        return {"divergent": self.divergent, "gap_unknown": self.gap_unknown, "later_divergent": self.later_divergent,
                "prompts_later_divergent": self.prompts_later_divergent, "flipped_positions": self.positions}


def unknown_only(p: PromptComparison, band: float) -> bool:
    """Whether a divergent first flip is divergent only because a side's gap is unknown."""
    d = p.first_divergence
    if p.status != Status.DIVERGENT or d is None:
        return False
    found = problems(d, band)
    return bool(found) and all(why.startswith(f"{side} gap unknown") for side, why in found)


def flip_tally(prompts: Sequence[PromptComparison], band: float, later: Mapping[str, Cascade]) -> Flips:
    """The headline's flips over every prompt compared."""
    flipped = [p for p in prompts if p.status in FLIPPED and p.first_divergence is not None]
    unknown = sum(1 for p in flipped if unknown_only(p, band))
    cascades = [later[p.id] for p in flipped if p.id in later]
    return Flips(divergent=sum(1 for p in flipped if p.status == Status.DIVERGENT) - unknown, gap_unknown=unknown,
                 later_divergent=sum(c.divergent_count for c in cascades),
                 prompts_later_divergent=sum(1 for c in cascades if c.divergent_count),
                 positions=len(flipped) + sum(c.flip_count + c.divergent_count for c in cascades))


def headline(counts: Mapping[str, int], flips: Flips | None) -> list[tuple[str, str]]:
    """(name, value) of every count the headline shows, in order: the statuses but match, with
    `divergent` split from `gap unknown`, then the later divergences and the flipped positions.
    flips None (a report from before them): the statuses as counted."""
    out = []
    for status, n in counts.items():
        if status == Status.MATCH:
            continue
        if status == Status.DIVERGENT and flips is not None:
            out += [(name, str(v)) for name, v in (("divergent", flips.divergent), ("gap unknown", flips.gap_unknown))
                    if v]
        elif n:
            out.append((str(status).replace("_", " "), str(n)))
    if flips is not None and flips.later_divergent:
        out.append(("later divergent", f"{flips.later_divergent} in {flips.prompts_later_divergent} prompt(s)"))
    if flips is not None and flips.positions:
        out.append(("flipped positions", str(flips.positions)))
    return out


def headline_text(counts: Mapping[str, int], flips: Flips | None) -> str:
    """The counts as the console and `show` word them: "near tie 2, divergent 1, ..."."""
    return ", ".join(f"{name} {value}" for name, value in headline(counts, flips))
