"""A `SpeedResult` back from the JSON it writes (report.json's `speed`), so a command that
rewrites a finished report (diagnose, localize, resume) keeps the speed section it did not redo.

The body is decoded by msgspec into the shapes below, one per `to_json`: a missing key, a
wrong type, an unknown enum value or a key `to_json` never writes is an `InputError` naming
the field (`speed: field rungs[0].ratio.ttft_s.median: ...`), never a traceback.

report.json holds each sample rounded to 6 decimals and each figure's median, spread and
ratio as they were computed from the unrounded samples: recomputed from the rounded ones they
could come out a digit apart. So a reloaded figure, ratio and rung carry what report.json says
(`WrittenFigure`, `WrittenRatio`, `WrittenRung`: the model's classes, their derived values read
instead of recomputed), and `to_json` of the reloaded result writes the very same body. A
non-finite figure is null in report.json; it is reloaded as NaN, which writes null again. What
report.json does not hold is not invented: a check's interval has no confidence there (NaN),
an interval no pooled spread (None); nothing renders either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from strict_gate.core.sections import Shape, read_section
from strict_gate.errors import InputError
from strict_gate.speed.interval import Interval
from strict_gate.speed.model import (
    ArmFigures,
    CheckOutcome,
    Figure,
    FigureName,
    Method,
    Mismatch,
    Order,
    Ratio,
    Rung,
    RungResult,
    SpeedCheck,
    SpeedResult,
    SpeedVerdict,
    SpeedVerdictKind,
    TokenCheck,
)

Count = Annotated[int, msgspec.Meta(ge=0)]
Number = float | None  # null: not measured, or not finite (report.json is strict JSON)
Pair = tuple[Number, Number]



class _Figure(Shape, frozen=True):
    median: Number
    spread: Pair | None
    samples: list[Number]


class _Arm(Shape, frozen=True):
    ttft_s: _Figure
    decode_tok_s: _Figure
    e2e_tok_s: _Figure
    tokens: Count
    self_reported: dict[str, Any] | None


class _Ratio(Shape, frozen=True):
    median: Number
    interval: Pair | None
    confidence: Number
    separable: bool


class _Ratios(Shape, frozen=True):
    ttft_s: _Ratio
    decode_tok_s: _Ratio
    e2e_tok_s: _Ratio


class _TokenCheck(Shape, frozen=True):
    checked: Count
    verified: bool | None  # derived from the two counts
    unverified: Count
    problems: list[str]


class _Rung(Shape, frozen=True):
    name: str
    prompt_tokens: Count | None
    max_tokens: Count
    concurrency: Count
    prompts: Count
    reference: _Arm | None
    candidate: _Arm | None
    ratio: _Ratios
    error: str | None
    token_check: _TokenCheck


class _Mismatch(Shape, frozen=True):
    field: str
    reference: Any
    candidate: Any
    flattering: bool
    message: str


class _Check(Shape, frozen=True):
    figure: FigureName
    rung: str
    min_ratio: Number
    speed_ratio: Number
    interval: Pair | None
    outcome: CheckOutcome
    passed: bool  # derived from the outcome
    runs_needed: Count | None
    bar: str


class _Verdict(Shape, frozen=True):
    verdict: SpeedVerdictKind
    min_speed_ratio: dict[str, Number]
    checks: list[_Check]
    reasons: list[str]


class SpeedSection(Shape, frozen=True):
    method: Method
    runs: Count
    warmup: Count
    machine: str
    order: Order
    arms: dict[str, str]
    rungs: list[_Rung]
    matched: bool | None  # derived from the mismatches and the checked rungs
    checked_rungs: list[str]
    mismatches: list[_Mismatch]
    verdict: SpeedVerdictKind
    speed_verdict: _Verdict
    notes: list[str]


@dataclass(frozen=True)
class WrittenFigure(Figure):
    """A figure as report.json holds it: its samples rounded, its median and spread as written
    (from the unrounded samples), not recomputed from the rounded ones."""

    written_median: float | None = None
    written_spread: tuple[float, float] | None = None

    @property
    def median(self) -> float | None:
        return self.written_median

    @property
    def spread(self) -> tuple[float, float] | None:
        return self.written_spread


@dataclass(frozen=True)
class WrittenRatio(Ratio):
    """A ratio as report.json holds it: separable as written (its ends are rounded there, and a
    rounded end can land on 1.0)."""

    written_separable: bool = False

    @property
    def separable(self) -> bool:
        return self.written_separable


@dataclass(frozen=True)
class WrittenRung(RungResult):
    """A rung as report.json holds it: each figure's ratio as written, not recomputed from the
    rounded samples."""

    written_ratios: tuple[tuple[FigureName, Ratio], ...] = ()

    def ratio(self, name: FigureName) -> Ratio:
        return dict(self.written_ratios)[name]


def load_speed(d: dict) -> SpeedResult:
    """The SpeedResult whose `to_json()` is `d` (report.json's `speed`); InputError naming the
    field when `d` is not such a body."""
    s = read_section(d, SpeedSection, "speed")
    if s.verdict is not s.speed_verdict.verdict:
        raise InputError(f"report.json's speed: field verdict: {s.verdict.value!r} disagrees with "
                         f"speed_verdict.verdict {s.speed_verdict.verdict.value!r}")
    v = s.speed_verdict
    return SpeedResult(
        method=s.method, runs=s.runs, warmup=s.warmup, rungs=tuple(_rung(r) for r in s.rungs),
        mismatches=tuple(Mismatch(m.field, m.reference, m.candidate, m.flattering, m.message) for m in s.mismatches),
        verdict=SpeedVerdict(v.verdict, {k: _f(b) for k, b in v.min_speed_ratio.items()}, tuple(_check(c) for c in v.checks), tuple(v.reasons)),
        machine=s.machine, notes=tuple(s.notes), checked_rungs=tuple(s.checked_rungs), order=s.order,
        arms=dict(s.arms),
    )


def _rung(r: _Rung) -> WrittenRung:
    ratios = tuple((name, _ratio(getattr(r.ratio, name.value))) for name in FigureName)
    return WrittenRung(Rung(r.name, r.prompt_tokens, r.max_tokens, r.concurrency, r.prompts),
                       _arm(r.reference), _arm(r.candidate), r.error,
                       TokenCheck(r.token_check.checked, tuple(r.token_check.problems), r.token_check.unverified),
                       written_ratios=ratios)


def _arm(a: _Arm | None) -> ArmFigures | None:
    if a is None:
        return None
    return ArmFigures(_figure(a.ttft_s), _figure(a.decode_tok_s), _figure(a.e2e_tok_s), a.tokens, a.self_reported)


def _figure(f: _Figure) -> WrittenFigure:
    return WrittenFigure(_floats(f.samples), written_median=f.median,
                         written_spread=None if f.spread is None else (_f(f.spread[0]), _f(f.spread[1])))


def _ratio(r: _Ratio) -> WrittenRatio:
    if r.interval is None:
        return WrittenRatio(None, written_separable=r.separable)
    lo, hi = r.interval
    confidence = math.nan if r.confidence is None else r.confidence
    return WrittenRatio(Interval(_f(r.median), _f(lo), _f(hi), confidence, None), written_separable=r.separable)


def _check(c: _Check) -> SpeedCheck:
    i = None if c.interval is None else Interval(_f(c.speed_ratio), _f(c.interval[0]), _f(c.interval[1]), math.nan,
                                                 None)
    return SpeedCheck(c.figure, c.rung, _f(c.min_ratio), i, c.outcome, c.bar, c.runs_needed)


def _f(x: float | None) -> float:
    """A value report.json wrote as null where a number stands: not finite (NaN writes null again)."""
    return math.nan if x is None else x


def _floats(xs: Sequence[float | None]) -> tuple[float, ...]:
    return tuple(_f(x) for x in xs)


