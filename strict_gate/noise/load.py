"""A `NoiseJudgement` back from the JSON it writes (report.json's `noise`), so a command that
rewrites a finished report (diagnose, localize, resume) keeps the noise section it did not redo.

The body is decoded by msgspec into the shapes below, one per `to_json`: a missing key, a
wrong type, an unknown placement (`where`), or a key `to_json` never writes is an `InputError`
naming the field (`noise: field flips[0].where: ...`). Its figures are written unrounded, so
the judgement comes back whole; what `to_json` derives (the headline, the prompts flipped) is
derived again, not read.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from strict_gate.core.sections import Shape, read_section
from strict_gate.noise.annotate import FlipNote, NoiseJudgement, Rate, Where

Count = Annotated[int, msgspec.Meta(ge=0)]



class _Flip(Shape, frozen=True):
    id: str
    position: Count
    gap: float | None
    ulps: float | None
    candidate_gap: float | None
    candidate_ulps: float | None
    where: Where


class _Rate(Shape, frozen=True):
    variation: str
    same_build: bool
    prompts: Count
    prompts_flipped: Count
    largest_gap: float | None


class NoiseSection(Shape, frozen=True):
    profile: str
    measured: str
    band: float
    band_rule: str | None
    largest_self_flip_gap: float | None
    headline: str  # derived
    rates: list[_Rate]
    self_gaps: list[float]
    build_gaps: list[float]
    prompts: Count
    prompts_flipped: Count  # derived
    flips: list[_Flip]
    notes: list[str]


def load_noise(d: dict) -> NoiseJudgement:
    """The NoiseJudgement whose `to_json()` is `d` (report.json's `noise`); InputError naming the
    field when `d` is not such a body."""
    s = read_section(d, NoiseSection, "noise")
    return NoiseJudgement(
        profile=s.profile, measured=s.measured, band=s.band, band_rule=s.band_rule,
        largest_self_flip_gap=s.largest_self_flip_gap,
        rates=tuple(Rate(r.variation, r.same_build, r.prompts, r.prompts_flipped, r.largest_gap) for r in s.rates),
        self_gaps=tuple(s.self_gaps), build_gaps=tuple(s.build_gaps),
        flips=tuple(FlipNote(f.id, f.position, f.gap, f.ulps, f.candidate_gap, f.candidate_ulps, f.where)
                    for f in s.flips),
        prompts=s.prompts, notes=tuple(s.notes),
    )
