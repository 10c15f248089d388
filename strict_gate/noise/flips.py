"""Self-flips: where the reference chose another token than itself, with both sides' gaps.

Two runs of the same prompts are compared at their first divergence (after it the prefixes
differ, so later positions are not the same question); a teacher-forced score of a run's own
tokens is compared at every step (each step has the decode's own prefix).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from strict_gate.noise.profile import K_RUNS, ExactTie, NoiseProfile, SelfFlip, Variation, largest
from strict_gate.noise.ulp import gap_ulps
from strict_gate.runs.records import Record, ScoredStep, TopK


def _lp(top: TopK | None, token: int) -> float | None:
    return None if top is None else next((lp for t, lp in top if t == token), None)


def _side_gap(top: TopK | None, own: int, other: int) -> float | None:
    """lp(own) - lp(other) on one side, >= 0 (a greedy side's own token is its argmax, up to the
    run's greedy tolerance); None when either token is outside its top-k."""
    mine, theirs = _lp(top, own), _lp(top, other)
    return None if mine is None or theirs is None else max(0.0, mine - theirs)


def _step(rec: Record, i: int) -> TopK | None:
    tops = rec.top_logprobs
    return None if tops is None or i >= len(tops) else tops[i]


@dataclass(frozen=True)
class FlipSite:
    """One flip before it is a SelfFlip: the two tokens and each side's top-k there."""

    id: str
    position: int
    a: int
    b: int
    top_a: TopK | None
    top_b: TopK | None
    logits: tuple[float, float] | None = None


def self_flip(site: FlipSite, variation: str, dtype: str) -> SelfFlip:
    gaps = (_side_gap(site.top_a, site.a, site.b), _side_gap(site.top_b, site.b, site.a))
    lps = (_lp(site.top_a, site.a), _lp(site.top_a, site.b))
    gap = largest(list(gaps))
    magnitude: float | None
    if site.logits is not None:
        magnitude, of = max(abs(x) for x in site.logits), "logit"
    else:
        known = [abs(x) for x in lps if x is not None]
        magnitude, of = (max(known) if known else None), "logprob"
    return SelfFlip(variation=variation, id=site.id, position=site.position, tokens=(site.a, site.b), gaps=gaps,
                    gap=gap, tie=any(g == 0.0 for g in gaps), logprobs=lps, logits=site.logits,
                    magnitude=magnitude, magnitude_of=of, ulps=gap_ulps(gap, dtype, magnitude))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where both have a token and they differ; None when one is a prefix of
    the other (a length difference is counted apart: no second token to weigh)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@dataclass(frozen=True)
class Tally:
    """What one variation compared, beside its flips."""

    prompts: int
    positions: int
    lengths: int  # prompts where one side only ended earlier


def run_sites(base: Mapping[str, Record], other: Mapping[str, Record]) -> tuple[list[FlipSite], Tally]:
    """Two runs of the same prompts, each prompt at its first divergence."""
    sites, prompts, positions, lengths = [], 0, 0, 0
    for pid, a in base.items():
        b = other.get(pid)
        if b is None or a.error is not None or b.error is not None:
            continue
        prompts += 1
        positions += max(len(a.token_ids), len(b.token_ids))
        i = first_divergence(a.token_ids, b.token_ids)
        if i is None:
            lengths += len(a.token_ids) != len(b.token_ids)
            continue
        sites.append(FlipSite(pid, i, a.token_ids[i], b.token_ids[i], _step(a, i), _step(b, i)))
    return sites, Tally(prompts, positions, lengths)


def sample_sites(base: Mapping[str, Record]) -> tuple[list[FlipSite], Tally]:
    """The K captured runs of each prompt: every later sample against the first (the golden,
    whose logprobs are kept; the other samples kept their tokens only)."""
    sites, prompts, positions, lengths = [], 0, 0, 0
    for pid, rec in base.items():
        samples = rec.samples or ()
        if rec.error is not None or len(samples) < 2:
            continue
        prompts += 1
        seen = set()
        for s in samples[1:]:
            positions += max(len(samples[0]), len(s))
            i = first_divergence(samples[0], s)
            if i is None:
                lengths += len(s) != len(samples[0])
                continue
            if (i, s[i]) not in seen:
                seen.add((i, s[i]))
                sites.append(FlipSite(pid, i, samples[0][i], s[i], _step(rec, i), None))
    return sites, Tally(prompts, positions, lengths)


def _keys(flips: Iterable[SelfFlip]) -> list[str]:
    return sorted(json.dumps(msgspec.to_builtins(f), sort_keys=True) for f in flips)


def sample_flip_problems(profile: NoiseProfile, records: Mapping[str, Record]) -> list[str]:
    """The K-run variations' flips and counts re-derived from the baseline's own records (the
    samples against the golden, sample_sites): a profile must hold exactly those, or it is not
    the profile of this baseline (a flip widened by hand, resealed, included)."""
    out = []
    for i, v in enumerate(profile.variations):
        if v.kind != K_RUNS:
            continue
        sites, tally = sample_sites(records)
        want = [self_flip(s, v.name, profile.provenance.dtype) for s in sites]
        have = profile.flips_of(v.name)
        if _keys(want) != _keys(have) or (v.prompts, v.positions) != (tally.prompts, tally.positions):
            out.append(f"variations[{i}] ({v.name}): its {len(have)} self-flip(s) over {v.prompts} prompt(s) are not "
                       f"what the baseline's records hold ({len(want)} over {tally.prompts}, re-derived from its "
                       "samples)")
    return out


def scored_sites(base: Mapping[str, Record], scored: Mapping[str, Sequence[ScoredStep]]) -> tuple[list[FlipSite], Tally]:
    """Each step's decode argmax (the run's own token) against its prefill argmax (the run's
    tokens teacher-forced through the same engine): every step, each on the decode's prefix."""
    sites, prompts, positions = [], 0, 0
    for pid, steps in scored.items():
        rec = base[pid]
        prompts += 1
        positions += len(steps)
        for i, (tok, step) in enumerate(zip(rec.token_ids, steps)):
            if step.argmax != tok:
                sites.append(FlipSite(pid, i, tok, step.argmax, _step(rec, i), step.top))
    return sites, Tally(prompts, positions, 0)


def variation(name: str, kind: str, detail: str, flips: Sequence[SelfFlip], tally: Tally, *,
              same_build: bool = True) -> Variation:
    more = f"; {tally.lengths} prompt(s) only ended at another length" if tally.lengths else ""
    return Variation(name=name, kind=kind, same_build=same_build, detail=detail + more, prompts=tally.prompts,
                     prompts_flipped=len({f.id for f in flips}), positions=tally.positions, flips=len(flips),
                     largest_gap=largest([f.gap for f in flips]), unknown_gaps=sum(f.gap is None for f in flips))


def exact_ties(records: Iterable[Record]) -> list[ExactTie]:
    """Every step of a run whose top two logprobs are exactly equal: a coin the dtype tossed."""
    out = []
    for rec in records:
        for i, top in enumerate(rec.top_logprobs or ()):
            if len(top) >= 2 and top[0][1] == top[1][1]:
                out.append(ExactTie(id=rec.id, position=i, tokens=(top[0][0], top[1][0]), logprob=top[0][1]))
    return out
