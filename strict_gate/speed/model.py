"""The speed result objects (what `[speed]` / `strict-gate bench` produce, what reports read).

Every figure is measured by the gate from outside the engine, over `runs` repetitions after
`warmup` discarded ones; a figure is its median and its spread (min, max). A ratio is always
candidate / reference of the figure as named: `decode_tok_s` 0.91 means the candidate decodes
at 0.91x the reference's tokens/s; `ttft_s` 1.40 means its first token takes 1.40x as long.
Its spread is the worst case over the two arms' spreads, so a spread that contains 1.0 means
the repetitions cannot tell the two arms apart ("not separable").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from strict_gate.core.fmt import fmt_vs
from strict_gate.errors import ExitCode


class Method(StrEnum):
    """How TTFT was measured; both arms of one ladder always use the same method, so a bar
    never compares figures measured two ways."""

    STREAM = "stream"  # TTFT and decode from one streamed request (OpenAI `stream`, the command protocol's events)
    TWO_REQUEST = "two-request"  # a max_tokens=1 request for TTFT, the full request for decode: biased, see judge_speed


class SpeedVerdictKind(StrEnum):
    PASS = "pass"  # every min_speed_ratio check holds on every rung
    FAIL = "fail"  # a check does not hold
    INCOMPLETE = "incomplete"  # a rung could not be measured on an arm: never a pass
    NOT_COMPARABLE = "not_comparable"  # a flattering mismatch, or timed tokens not verified: never a pass
    INFORMATIONAL = "informational"  # no min_speed_ratio: figures only, no second verdict


class FigureName(StrEnum):
    """The three figures of a rung, named as in report.json."""

    TTFT = "ttft_s"
    DECODE = "decode_tok_s"
    E2E = "e2e_tok_s"


HIGHER_IS_FASTER = {FigureName.TTFT: False, FigureName.DECODE: True, FigureName.E2E: True}


@dataclass(frozen=True)
class Figure:
    """One figure over the measured repetitions."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.samples), max(self.samples)) if self.samples else None

    def to_json(self) -> dict:
        return {"median": _r(self.median), "spread": None if self.spread is None else [_r(x) for x in self.spread],
                "samples": [_r(x) for x in self.samples]}


@dataclass(frozen=True)
class Ratio:
    """candidate / reference of one figure: the medians' ratio and its worst-case spread."""

    median: float | None
    spread: tuple[float, float] | None

    @property
    def separable(self) -> bool:
        """False when the spread contains 1.0 (or nothing was measured)."""
        return self.spread is not None and not (self.spread[0] <= 1.0 <= self.spread[1])

    @classmethod
    def of(cls, candidate: Figure, reference: Figure) -> Ratio:
        if not candidate.samples or not reference.samples or not reference.median:
            return cls(None, None)
        assert candidate.spread and reference.spread and candidate.median is not None  # both have samples
        (clo, chi), (rlo, rhi) = candidate.spread, reference.spread
        lo = clo / rhi if rhi > 0 else math.inf
        hi = chi / rlo if rlo > 0 else math.inf
        return cls(candidate.median / reference.median, (lo, hi))

    def to_json(self) -> dict:
        return {"median": _r(self.median), "spread": None if self.spread is None else [_r(x) for x in self.spread],
                "separable": self.separable}


@dataclass(frozen=True)
class ArmFigures:
    """One arm on one rung."""

    ttft_s: Figure
    decode_tok_s: Figure
    e2e_tok_s: Figure
    tokens: int  # tokens generated per sequence in the full request (median over repetitions)
    self_reported: dict | None = None  # the engine's own metrics, shown beside, never used

    def figure(self, name: FigureName) -> Figure:
        return getattr(self, name.value)

    def to_json(self) -> dict:
        out: dict[str, object] = {f.value: self.figure(f).to_json() for f in FigureName}
        out["tokens"] = self.tokens
        out["self_reported"] = self.self_reported
        return out


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: prompt length x generated tokens x concurrent sequences."""

    name: str  # "128/128", "1024/128@4", "gate"
    prompt_tokens: int | None  # None: the gate's own prompt set (its own lengths)
    max_tokens: int
    concurrency: int = 1
    prompts: int = 1  # prompts per request batch (the gate rung: the whole set)

    def to_json(self) -> dict:
        return {"name": self.name, "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
                "concurrency": self.concurrency, "prompts": self.prompts}


@dataclass(frozen=True)
class TokenCheck:
    """What was verified of the tokens timed on a rung (gate/timed_tokens.py): every timed reply
    against the arm's own gate record, or against the other arm's reply to the same request."""

    checked: int = 0  # timed replies compared
    problems: tuple[str, ...] = ()  # the first few that did not verify, in words
    unverified: int = 0  # how many did not verify (problems shows at most a few)

    @property
    def verified(self) -> bool | None:
        """True when every timed reply checked out; None when nothing could be compared."""
        return None if not self.checked else not self.unverified

    def to_json(self) -> dict:
        return {"checked": self.checked, "verified": self.verified, "unverified": self.unverified,
                "problems": list(self.problems)}


@dataclass(frozen=True)
class RungResult:
    rung: Rung
    reference: ArmFigures | None
    candidate: ArmFigures | None
    error: str | None = None  # why an arm could not be measured on this rung
    token_check: TokenCheck = field(default_factory=TokenCheck)

    def ratio(self, name: FigureName) -> Ratio:
        if self.reference is None or self.candidate is None:
            return Ratio(None, None)
        return Ratio.of(self.candidate.figure(name), self.reference.figure(name))

    def to_json(self) -> dict:
        return {
            **self.rung.to_json(),
            "reference": self.reference.to_json() if self.reference else None,
            "candidate": self.candidate.to_json() if self.candidate else None,
            "ratio": {f.value: self.ratio(f).to_json() for f in FigureName},
            "error": self.error,
            "token_check": self.token_check.to_json(),
        }


@dataclass(frozen=True)
class Mismatch:
    """A configuration difference between the arms found before measuring."""

    field: str  # "dtype", "eager", "concurrency", "prompt_set", "kv_cache", ...
    reference: object
    candidate: object
    flattering: bool = False  # the difference makes the candidate's ratio look better than it is
    message: str = ""

    def to_json(self) -> dict:
        return {"field": self.field, "reference": self.reference, "candidate": self.candidate,
                "flattering": self.flattering, "message": self.message}


@dataclass(frozen=True)
class SpeedCheck:
    """One min_speed_ratio check on one rung: the speed ratio (>1 candidate faster) against the bar.
    `bar` names the min_speed_ratio entry that asked for it: a two-request decode bar also
    checks e2e (figure e2e_tok_s, bar "decode")."""

    figure: FigureName
    rung: str
    min_ratio: float
    speed_ratio: float | None  # decode/e2e: candidate/reference; TTFT: reference/candidate
    passed: bool
    bar: str = ""

    def to_json(self) -> dict:
        return {"figure": self.figure.value, "rung": self.rung, "min_ratio": self.min_ratio,
                "speed_ratio": _r(self.speed_ratio), "passed": self.passed, "bar": self.bar}


@dataclass(frozen=True)
class SpeedVerdict:
    kind: SpeedVerdictKind
    min_speed_ratio: dict[str, float]  # {"decode": 0.95, "ttft": 0.9}; empty: informational
    checks: tuple[SpeedCheck, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        """Pass or informational; slower below the bar or not comparable; engine failure when not measured (never a pass)."""
        return {SpeedVerdictKind.FAIL: ExitCode.SLOWER, SpeedVerdictKind.NOT_COMPARABLE: ExitCode.SLOWER,
                SpeedVerdictKind.INCOMPLETE: ExitCode.ENGINE_FAILURE}.get(self.kind, ExitCode.PASS)

    def to_json(self) -> dict:
        return {"verdict": self.kind.value, "min_speed_ratio": dict(self.min_speed_ratio),
                "checks": [c.to_json() for c in self.checks], "reasons": list(self.reasons)}


@dataclass(frozen=True)
class SpeedResult:
    method: Method
    runs: int
    warmup: int
    rungs: tuple[RungResult, ...]
    mismatches: tuple[Mismatch, ...]
    verdict: SpeedVerdict
    machine: str = ""  # CPU/GPU model, cores: the figures depend on it
    notes: tuple[str, ...] = field(default_factory=tuple)
    checked_rungs: tuple[str, ...] = ()  # rungs the matched check compared (measured on both arms)

    @property
    def matched(self) -> bool | None:
        """False with a mismatch; True only when a rung was compared and nothing differed;
        None when nothing was compared (no rung measured on both arms)."""
        if self.mismatches:
            return False
        return True if self.checked_rungs else None

    def to_json(self) -> dict:
        return {
            "method": self.method.value,
            "runs": self.runs,
            "warmup": self.warmup,
            "machine": self.machine,
            "rungs": [r.to_json() for r in self.rungs],
            "matched": self.matched,
            "checked_rungs": list(self.checked_rungs),
            "mismatches": [m.to_json() for m in self.mismatches],
            "verdict": self.verdict.kind.value,
            "speed_verdict": self.verdict.to_json(),
            "notes": list(self.notes),
        }


def speed_ratio(rung: RungResult, name: FigureName) -> float | None:
    """The ratio oriented so that >1 means the candidate is faster (TTFT inverted)."""
    r = rung.ratio(name).median
    if r is None or r == 0:
        return None
    return r if HIGHER_IS_FASTER[name] else 1.0 / r


NAMES = {"decode": FigureName.DECODE, "ttft": FigureName.TTFT, "e2e": FigureName.E2E}


def blockers(rungs: Sequence[RungResult], mismatches: Sequence[Mismatch]) -> list[str]:
    """Why the ratios cannot be compared at all: a flattering mismatch (the denominator is not
    a matched run), or a rung whose timed tokens are not the ones the gate verified."""
    out = [f"not comparable: {m.field} ({m.message or 'flattering'}; reference {m.reference!r}, "
           f"candidate {m.candidate!r})" for m in mismatches if m.flattering]
    for r in rungs:
        check = r.token_check
        if check.unverified:
            more = len(check.problems) < check.unverified
            out.append(f"not comparable: rung {r.rung.name}: {check.unverified} timed repl"
                       f"{'ies' if check.unverified != 1 else 'y'} not verified: " + "; ".join(check.problems)
                       + ("; ..." if more else ""))
        elif r.reference is not None and r.candidate is not None and check.verified is None:
            out.append(f"not comparable: rung {r.rung.name}: no timed reply could be checked")
    return out


def _checks(rung: RungResult, key: str, bar: float, method: Method) -> list[SpeedCheck]:
    """The checks one bar makes on one rung. Two-request decode is (n - 1) / (t_full - TTFT) of
    two different requests: an engine slow to answer max_tokens=1 (or with the full request's
    prompt cached) gets a decode figure its end-to-end speed belies, so a two-request decode
    bar holds e2e to the same bar."""
    names = [NAMES[key]] + ([FigureName.E2E] if key == "decode" and method is Method.TWO_REQUEST else [])
    out = []
    for name in names:
        got = speed_ratio(rung, name)
        out.append(SpeedCheck(name, rung.rung.name, bar, got, got is not None and got >= bar, key))
    return out


def _reason(check: SpeedCheck, rung: RungResult) -> str:
    if check.speed_ratio is None:
        return f"rung {check.rung}: {check.bar} not measured ({rung.error or 'no figures'})"
    got, bar = fmt_vs(check.speed_ratio, check.min_ratio, min_digits=2)
    if check.figure is NAMES[check.bar]:
        return f"rung {check.rung}: {check.bar} speed {got}x reference < {bar}x"
    return (f"rung {check.rung}: e2e speed {got}x reference < the decode bar {bar}x (two-request decode "
            "is held against e2e: it cannot tell a slow max_tokens=1 request from fast decoding)")


def judge_speed(rungs: Sequence[RungResult], min_speed_ratio: dict[str, float], *, method: Method,
                mismatches: Sequence[Mismatch] = ()) -> SpeedVerdict:
    """The second verdict: every rung's speed ratio at or above each bar; unmeasured is
    incomplete; a flattering mismatch or unverified timed tokens make it not comparable.
    Without a bar there is no verdict, but what blocks one is still said."""
    blocked = blockers(rungs, mismatches)
    if not min_speed_ratio:
        return SpeedVerdict(SpeedVerdictKind.INFORMATIONAL, {}, reasons=tuple(blocked))
    checks = [c for rung in rungs for key, bar in min_speed_ratio.items() for c in _checks(rung, key, bar, method)]
    by_name = {r.rung.name: r for r in rungs}
    reasons = list(dict.fromkeys(blocked + [_reason(c, by_name[c.rung]) for c in checks if not c.passed]))
    incomplete = not rungs or any(c.speed_ratio is None for c in checks)
    if not rungs:
        reasons.append("no rung was measured")
    kind = (SpeedVerdictKind.NOT_COMPARABLE if blocked
            else SpeedVerdictKind.INCOMPLETE if incomplete
            else SpeedVerdictKind.FAIL if any(not c.passed for c in checks) else SpeedVerdictKind.PASS)
    return SpeedVerdict(kind, dict(min_speed_ratio), tuple(checks), tuple(reasons))


def _r(x: float | None) -> float | None:
    """Rounded for JSON; non-finite figures are null (report.json is strict JSON)."""
    if x is None or not math.isfinite(x):
        return None
    return round(x, 6)
