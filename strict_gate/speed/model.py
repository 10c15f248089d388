"""The speed result objects (what `[speed]` / `strict-gate bench` produce, what reports read).

Every figure is measured by the gate from outside the engine, over `runs` repetitions after
`warmup` discarded ones; a figure is its median and its spread (min, max). A ratio is always
candidate / reference of the figure as named: `decode_tok_s` 0.91 means the candidate decodes
at 0.91x the reference's tokens/s; `ttft_s` 1.40 means its first token takes 1.40x as long.
It is the median of the pairwise ratios with a 95 % interval (speed/interval.py); an interval
that contains 1.0, or that the runs are too few to reach 95 % at all, means the repetitions
cannot tell the two arms apart ("not separable"). A bar is judged against the interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import StrEnum

from strict_gate.errors import ExitCode
from strict_gate.speed.interval import Interval, ratio_interval


class Method(StrEnum):
    """How TTFT was measured; both arms of one ladder always use the same method, so a bar
    never compares figures measured two ways."""

    STREAM = "stream"  # TTFT and decode from one streamed request (OpenAI `stream`, the command protocol's events)
    TWO_REQUEST = "two-request"  # a max_tokens=1 request for TTFT, the full request for decode: biased, see judge_speed


class Order(StrEnum):
    """How the arms' repetitions were ordered in time."""

    INTERLEAVED = "interleaved"  # both engines loaded, repetitions in ABBA turns (bench --interleave)
    SEQUENTIAL = "sequential"  # one engine at a time: every candidate repetition, then every reference one


class SpeedVerdictKind(StrEnum):
    PASS = "pass"  # every min_speed_ratio check holds on every rung
    FAIL = "fail"  # a check does not hold
    INCOMPLETE = "incomplete"  # a rung could not be measured on an arm: never a pass
    NOT_SEPARABLE = "not_separable"  # a bar inside an interval: more runs needed, never a pass
    NOT_COMPARABLE = "not_comparable"  # a flattering mismatch, or no timed reply checked: never a pass
    TOKENS_NOT_VERIFIED = "tokens_not_verified"  # a timed reply's tokens did not verify: the gate fails, bar or no bar
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
    """candidate / reference of one figure: the estimate with its interval (None: not measured)."""

    interval: Interval | None

    @property
    def median(self) -> float | None:
        return None if self.interval is None else self.interval.estimate

    @property
    def separable(self) -> bool:
        """True only when the interval reaches 95 % and lies wholly on one side of 1.0."""
        i = self.interval
        return i is not None and i.reached and not (i.lower <= 1.0 <= i.upper)

    @classmethod
    def of(cls, candidate: Figure, reference: Figure) -> Ratio:
        return cls(ratio_interval(candidate.samples, reference.samples))

    def to_json(self) -> dict:
        i = self.interval
        return {"median": _r(self.median), "interval": None if i is None else [_r(i.lower), _r(i.upper)],
                "confidence": None if i is None else round(i.confidence, 4), "separable": self.separable}


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
    """What was verified of the tokens timed on a rung (timed_tokens.py): every timed reply
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

    def runs(self, name: FigureName) -> int:
        """The repetitions behind a ratio: the fewer of the two arms' samples."""
        if self.reference is None or self.candidate is None:
            return 0
        return min(len(self.reference.figure(name).samples), len(self.candidate.figure(name).samples))

    def ratio(self, name: FigureName) -> Ratio:
        if self.reference is None or self.candidate is None:
            return Ratio(None)
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


class CheckOutcome(StrEnum):
    PASS = "pass"  # the whole interval at or above the bar
    BELOW = "below"  # the whole interval below it
    NOT_SEPARABLE = "not_separable"  # the bar inside the interval, or an interval short of 95 %
    NOT_MEASURED = "not_measured"


@dataclass(frozen=True)
class SpeedCheck:
    """One min_speed_ratio check on one rung: the speed ratio (>1 candidate faster) and its
    interval against the bar. `bar` names the min_speed_ratio entry that asked for it: a
    two-request decode bar also checks e2e (figure e2e_tok_s, bar "decode")."""

    figure: FigureName
    rung: str
    min_ratio: float
    interval: Interval | None  # decode/e2e: candidate/reference; TTFT: reference/candidate
    outcome: CheckOutcome
    bar: str = ""
    runs_needed: int | None = None  # not separable: repetitions per arm that would likely separate it

    @property
    def passed(self) -> bool:
        return self.outcome is CheckOutcome.PASS

    @property
    def speed_ratio(self) -> float | None:
        return None if self.interval is None else self.interval.estimate

    def to_json(self) -> dict:
        i = self.interval
        return {"figure": self.figure.value, "rung": self.rung, "min_ratio": self.min_ratio,
                "speed_ratio": _r(self.speed_ratio), "interval": None if i is None else [_r(i.lower), _r(i.upper)],
                "outcome": self.outcome.value, "passed": self.passed, "runs_needed": self.runs_needed,
                "bar": self.bar}


@dataclass(frozen=True)
class SpeedVerdict:
    kind: SpeedVerdictKind
    min_speed_ratio: dict[str, float]  # {"decode": 0.95, "ttft": 0.9}; empty: informational
    checks: tuple[SpeedCheck, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        """Pass or informational; a fail (1) when timed tokens did not verify: the candidate
        emitted tokens nobody judged on the requests it was timed on, a token failure whether
        or not a bar was set; slower below the bar or not comparable (established); engine
        failure when not measured, or not separable (not established either way: more runs would
        say; never a pass)."""
        return {SpeedVerdictKind.TOKENS_NOT_VERIFIED: ExitCode.FAIL,
                SpeedVerdictKind.FAIL: ExitCode.SLOWER, SpeedVerdictKind.NOT_COMPARABLE: ExitCode.SLOWER,
                SpeedVerdictKind.INCOMPLETE: ExitCode.ENGINE_FAILURE,
                SpeedVerdictKind.NOT_SEPARABLE: ExitCode.ENGINE_FAILURE}.get(self.kind, ExitCode.PASS)

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
    order: Order = Order.SEQUENTIAL
    arms: dict[str, str] = field(default_factory=dict)  # role -> the engine kind timed in it

    @property
    def matched(self) -> bool | None:
        """False with a mismatch; True only when a rung was compared and nothing differed;
        None when nothing was compared (no rung measured on both arms)."""
        if self.mismatches:
            return False
        return True if self.checked_rungs else None

    @property
    def exit_code(self) -> ExitCode:
        """This section's exit contribution (judge/result.py ranks it against the others')."""
        return self.verdict.exit_code

    @property
    def section_verdict(self) -> str:
        return str(self.verdict.kind)

    def to_json(self) -> dict:
        return {
            "method": self.method.value,
            "runs": self.runs,
            "warmup": self.warmup,
            "machine": self.machine,
            "order": self.order.value,
            "arms": dict(self.arms),
            "rungs": [r.to_json() for r in self.rungs],
            "matched": self.matched,
            "checked_rungs": list(self.checked_rungs),
            "mismatches": [m.to_json() for m in self.mismatches],
            "verdict": self.verdict.kind.value,
            "speed_verdict": self.verdict.to_json(),
            "notes": list(self.notes),
        }


def speed_ratio(rung: RungResult, name: FigureName) -> Interval | None:
    """The ratio and its interval oriented so that >1 means the candidate is faster (TTFT inverted)."""
    i = rung.ratio(name).interval
    if i is None:
        return None
    return i if HIGHER_IS_FASTER[name] else i.inverted()


def _r(x: float | None) -> float | None:
    """Rounded for JSON; non-finite figures are null (report.json is strict JSON)."""
    if x is None or not math.isfinite(x):
        return None
    return round(x, 6)
