"""Each candidate flip placed against the reference's own noise, and the rates side by side.

A candidate flip's gap is the reference's gap at the divergence (its decode gap, or its
re-scored one, the larger known), the same measure as a self-flip's: so "within the
reference's own noise" means the reference has itself flipped a choice at least this close.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from strict_gate.core.sections import Informational
from strict_gate.judge.compare import BAND_EPS, Comparison, Rescored, Status
from strict_gate.noise.profile import NoiseProfile, largest
from strict_gate.noise.ulp import gap_ulps
from strict_gate.runs.records import TopK


class Where(StrEnum):
    WITHIN = "within its noise"
    BEYOND_NOISE = "beyond its noise, inside the band"
    BEYOND_BAND = "beyond the band"
    UNKNOWN = "gap unknown"


@dataclass(frozen=True)
class FlipNote:
    id: str
    position: int
    gap: float | None  # the reference's gap at the divergence
    ulps: float | None  # in the reference's dtype at the larger |logprob| of the two tokens
    candidate_gap: float | None
    candidate_ulps: float | None
    where: Where

    def to_json(self) -> dict:
        return {"id": self.id, "position": self.position, "gap": self.gap, "ulps": self.ulps,
                "candidate_gap": self.candidate_gap, "candidate_ulps": self.candidate_ulps, "where": self.where.value}


@dataclass(frozen=True)
class Rate:
    variation: str
    same_build: bool
    prompts: int
    prompts_flipped: int
    largest_gap: float | None

    def text(self) -> str:
        return f"{self.variation} {self.prompts_flipped}/{self.prompts}"


@dataclass(frozen=True)
class NoiseJudgement(Informational):
    """What a report says about the reference's noise; band_rule is set when the band came from it."""

    profile: str
    measured: str  # battery, model, dtype, K, when: one line of the profile's provenance
    band: float
    band_rule: str | None
    largest_self_flip_gap: float | None
    rates: tuple[Rate, ...]
    self_gaps: tuple[float, ...]  # the known gaps of the same-build self-flips (the picture)
    build_gaps: tuple[float, ...]  # of a second build's flips
    flips: tuple[FlipNote, ...]
    prompts: int  # candidate prompts compared
    notes: tuple[str, ...] = ()

    @property
    def prompts_flipped(self) -> int:
        return len({f.id for f in self.flips})

    def describe(self, where: Where) -> str:
        reach = ("the reference never flipped against itself" if self.largest_self_flip_gap is None
                 else f"its self-flips reach {self.largest_self_flip_gap:.4g} nats")
        if where == Where.WITHIN:
            return f"within the reference's own noise ({reach})"
        if where == Where.BEYOND_NOISE:
            return f"beyond its noise ({reach}), inside the band {self.band:g}"
        if where == Where.BEYOND_BAND:
            return f"beyond its noise ({reach}) and beyond the band {self.band:g}"
        return "gap unknown (the candidate's token is outside the reference's top-k): beyond its noise"

    def headline(self) -> str:
        same = [r for r in self.rates if r.same_build]
        builds = [r for r in self.rates if not r.same_build]
        top = max(same, key=lambda r: r.prompts_flipped / r.prompts if r.prompts else 0.0, default=None)
        own = (f"the reference against itself at most {top.prompts_flipped}/{top.prompts} ({top.variation})"
               if top else "the reference's own flips were not measured")
        other = f"; another build of it {', '.join(r.text() for r in builds)}" if builds else ""
        within = sum(f.where == Where.WITHIN for f in self.flips)
        return (f"candidate flips on {self.prompts_flipped}/{self.prompts} prompts, {within} within the "
                f"reference's own noise; {own}{other}")

    def lines(self, cap: int | None = None) -> list[str]:
        """Headline, profile, band rule, rates, then each flip (the first `cap` of them)."""
        out = [self.headline(), f"profile {self.profile}: {self.measured}"]
        if self.band_rule:
            out.append(f"measured band: {self.band_rule}")
        out.append("self-flips: " + ", ".join(f"{r.text()} (largest {_g(r.largest_gap)})" for r in self.rates))
        shown = self.flips if cap is None else self.flips[:cap]
        out += [f"{f.id} @ {f.position}: gap {_g(f.gap)}{_u(f.ulps)}: {self.describe(f.where)}" for f in shown]
        if len(shown) < len(self.flips):
            out.append(f"... {len(self.flips) - len(shown)} more flips in the report")
        return out + list(self.notes)

    def to_json(self) -> dict:
        return {"profile": self.profile, "measured": self.measured, "band": self.band, "band_rule": self.band_rule,
                "largest_self_flip_gap": self.largest_self_flip_gap, "headline": self.headline(),
                "rates": [r.__dict__ for r in self.rates], "self_gaps": list(self.self_gaps),
                "build_gaps": list(self.build_gaps), "prompts": self.prompts,
                "prompts_flipped": self.prompts_flipped, "flips": [f.to_json() for f in self.flips],
                "notes": list(self.notes)}


def _g(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.4g}"


def _u(x: float | None) -> str:
    return "" if x is None else f" ({x:.3g} ulps)"


def _mag(top: TopK | None, a: int | None, b: int | None) -> float | None:
    vals = [abs(lp) for t, lp in (top or ()) if t in (a, b)]
    return max(vals) if vals else None


def _gap(decode: float | None, rescored: Rescored | None) -> float | None:
    """A side's gap at the divergence: its decode gap or its re-scored |gap|, the larger known."""
    return largest([decode, None if rescored is None or rescored.gap is None else abs(rescored.gap)])


def place(gap: float | None, largest_self: float | None, band: float) -> Where:
    if gap is None:
        return Where.UNKNOWN
    if largest_self is not None and gap <= largest_self + BAND_EPS:
        return Where.WITHIN
    return Where.BEYOND_NOISE if gap <= band + BAND_EPS else Where.BEYOND_BAND


def judge_noise(profile: NoiseProfile, path: str, comparison: Comparison, *, band: float, band_rule: str | None,
                dtypes: Mapping[str, str | None]) -> NoiseJudgement:
    """Every diverged prompt of the comparison against the profile. `dtypes`: each arm's."""
    flips = []
    for pc in comparison.prompts:
        d = pc.first_divergence
        if pc.status not in (Status.NEAR_TIE, Status.DIVERGENT) or d is None or d.candidate_token is None \
                or d.reference_token is None:
            continue
        gap = _gap(d.reference_gap, d.reference_rescored)
        cgap = _gap(d.candidate_gap, d.candidate_rescored)
        flips.append(FlipNote(
            pc.id, d.position, gap, gap_ulps(gap, dtypes.get("reference"), _mag(d.reference_top, d.reference_token,
                                                                               d.candidate_token)),
            cgap, gap_ulps(cgap, dtypes.get("candidate"), _mag(d.candidate_top, d.reference_token, d.candidate_token)),
            place(gap, profile.largest_self_flip_gap, band)))
    p = profile.provenance
    same = {v.name for v in profile.same_build}
    return NoiseJudgement(
        profile=path,
        measured=f"{p.model} {p.dtype}, battery {p.battery.name} ({p.battery.count} prompts), K = {p.k}, {p.engine} "
                 f"{', '.join(f'{k} {v}' for k, v in sorted(p.versions.items()))}, measured {p.created}",
        band=band, band_rule=band_rule, largest_self_flip_gap=profile.largest_self_flip_gap,
        rates=tuple(Rate(v.name, v.same_build, v.prompts, v.prompts_flipped, v.largest_gap)
                    for v in profile.variations),
        self_gaps=tuple(f.gap for f in profile.self_flips if f.variation in same and f.gap is not None),
        build_gaps=tuple(f.gap for f in profile.self_flips if f.variation not in same and f.gap is not None),
        flips=tuple(flips), prompts=comparison.summary.prompts_total, notes=tuple(p.notes))
