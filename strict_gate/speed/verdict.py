"""The speed verdict: each `min_speed_ratio` bar judged against a ratio's whole interval (pass,
below, not separable), what blocks a comparison, and the verdict over every rung. The figures it
judges are speed/model.py's."""

from __future__ import annotations

from collections.abc import Sequence

from strict_gate.core.fmt import fmt_vs
from strict_gate.speed.interval import LEVEL, Interval, runs_needed
from strict_gate.speed.model import (
    CheckOutcome,
    FigureName,
    Method,
    Mismatch,
    RungResult,
    SpeedCheck,
    SpeedVerdict,
    SpeedVerdictKind,
    speed_ratio,
)


def _outcome(got: Interval | None, bar: float) -> CheckOutcome:
    """The rule: a pass only when the whole interval is at or above the bar, below only when it is
    wholly below, not separable otherwise or when the runs cannot reach 95 % confidence."""
    if got is None:
        return CheckOutcome.NOT_MEASURED
    if not got.reached:
        return CheckOutcome.NOT_SEPARABLE
    if got.lower >= bar:
        return CheckOutcome.PASS
    return CheckOutcome.BELOW if got.upper < bar else CheckOutcome.NOT_SEPARABLE


NAMES = {"decode": FigureName.DECODE, "ttft": FigureName.TTFT, "e2e": FigureName.E2E}


def blockers(rungs: Sequence[RungResult], mismatches: Sequence[Mismatch]) -> list[str]:
    """Why the ratios cannot be compared at all: a flattering mismatch (the denominator is not
    a matched run), or a rung measured on both arms whose timed replies none could be checked."""
    out = [f"not comparable: {m.field} ({m.message or 'flattering'}; reference {m.reference!r}, "
           f"candidate {m.candidate!r})" for m in mismatches if m.flattering]
    out += [f"not comparable: rung {r.rung.name}: no timed reply could be checked" for r in rungs
            if r.reference is not None and r.candidate is not None and r.token_check.verified is None]
    return out


def unverified_tokens(rungs: Sequence[RungResult]) -> list[str]:
    """Every rung whose timed replies did not all verify (speed/timed_tokens.py): tokens nobody
    judged, emitted on the requests that were timed, fail the gate whatever the figures say."""
    out = []
    for r in rungs:
        check = r.token_check
        if check.unverified:
            more = len(check.problems) < check.unverified
            out.append(f"timed tokens not verified: rung {r.rung.name}: {check.unverified} timed repl"
                       f"{'ies' if check.unverified != 1 else 'y'} did not verify: " + "; ".join(check.problems)
                       + ("; ..." if more else ""))
    return out


def differences(mismatches: Sequence[Mismatch]) -> list[str]:
    """Every other configuration difference, named in the verdict's reasons: a ratio across
    mismatched configs is not meeting the reference's speed at its config, pass or not."""
    return [f"not at a matched config: {m.field} ({m.message or 'differs'}; reference {m.reference!r}, "
            f"candidate {m.candidate!r})" for m in mismatches if not m.flattering]


def _checks(rung: RungResult, key: str, bar: float, method: Method) -> list[SpeedCheck]:
    """The checks one bar makes on one rung. Two-request decode is (n - 1) / (t_full - TTFT) of
    two different requests: an engine slow to answer max_tokens=1 (or with the full request's
    prompt cached) gets a decode figure its end-to-end speed belies, so a two-request decode
    bar holds e2e to the same bar."""
    names = [NAMES[key]] + ([FigureName.E2E] if key == "decode" and method is Method.TWO_REQUEST else [])
    out = []
    for name in names:
        got = speed_ratio(rung, name)
        outcome = _outcome(got, bar)
        needed = runs_needed(got, bar, rung.runs(name)) if got is not None and outcome is CheckOutcome.NOT_SEPARABLE else None
        out.append(SpeedCheck(name, rung.rung.name, bar, got, outcome, key, needed))
    return out


def _shown(i: Interval, bar: float) -> tuple[str, str]:
    """ "0.97x reference [0.93, 1.01]" and the bar, with the decimals that tell the bar from the
    interval's end nearest to it."""
    near = min((i.lower, i.upper), key=lambda x: abs(x - bar))
    end, shown_bar = fmt_vs(near, bar, min_digits=2)
    digits = len(end.split(".")[1]) if "." in end else 2
    lo, est, hi = (f"{x:.{digits}f}" for x in (i.lower, i.estimate, i.upper))
    return f"{est}x reference [{lo}, {hi}]", shown_bar


def _reason(check: SpeedCheck, rung: RungResult) -> str:
    i, runs = check.interval, rung.runs(check.figure)
    if i is None:
        return f"rung {check.rung}: {check.bar} not measured ({rung.error or 'no figures'})"
    shown, bar = _shown(i, check.min_ratio)
    what = f"{check.bar} speed" if check.figure is NAMES[check.bar] else "e2e speed"
    held = "" if check.figure is NAMES[check.bar] else (
        " (two-request decode is held against e2e: it cannot tell a slow max_tokens=1 request from fast decoding)")
    if check.outcome is CheckOutcome.BELOW:
        return f"rung {check.rung}: {what} {shown} < {bar}x{held}"
    short = ("" if i.reached else ", whose samples tie (every ratio the same): ties carry no confidence"
             if i.tied else f", which reach only {i.confidence:.0%} confidence, not {LEVEL:.0%}")
    more = (f"; about {check.runs_needed} runs per arm would separate it (estimated from the spread)"
            if check.runs_needed else "; the spread does not say how many runs would separate it")
    return (f"rung {check.rung}: {what} {shown} is not separable from the bar {bar}x at {runs} "
            f"run{'s' if runs != 1 else ''}{short}{more}{held}")


def judge_speed(rungs: Sequence[RungResult], min_speed_ratio: dict[str, float], *, method: Method,
                mismatches: Sequence[Mismatch] = ()) -> SpeedVerdict:
    """The second verdict: every rung's speed interval wholly at or above each bar; one wholly
    below fails; a bar inside an interval is not separable; unmeasured is incomplete; a
    flattering mismatch makes it not comparable. Timed tokens that did not verify come first,
    bar or no bar: they fail (exit 1). Without a bar there is no verdict on the figures, but
    what blocks one is still said."""
    failed = unverified_tokens(rungs)
    blocked = failed + blockers(rungs, mismatches)
    void = _unmeasured_arms(rungs) + differences(mismatches)
    if not min_speed_ratio:
        kind = (SpeedVerdictKind.TOKENS_NOT_VERIFIED if failed
                else SpeedVerdictKind.INCOMPLETE if _unmeasured_arms(rungs) else SpeedVerdictKind.INFORMATIONAL)
        return SpeedVerdict(kind, {}, reasons=tuple(blocked + void))
    checks = [c for rung in rungs for key, bar in min_speed_ratio.items() for c in _checks(rung, key, bar, method)]
    by_name = {r.rung.name: r for r in rungs}
    reasons = list(dict.fromkeys(blocked + [_reason(c, by_name[c.rung]) for c in checks if not c.passed] + void))
    outcomes = {c.outcome for c in checks}
    kind = (SpeedVerdictKind.TOKENS_NOT_VERIFIED if failed
            else SpeedVerdictKind.NOT_COMPARABLE if blocked
            else SpeedVerdictKind.INCOMPLETE if _unmeasured_arms(rungs) or CheckOutcome.NOT_MEASURED in outcomes
            else SpeedVerdictKind.FAIL if CheckOutcome.BELOW in outcomes
            else SpeedVerdictKind.NOT_SEPARABLE if CheckOutcome.NOT_SEPARABLE in outcomes
            else SpeedVerdictKind.PASS)
    return SpeedVerdict(kind, dict(min_speed_ratio), tuple(checks), tuple(reasons))


def _unmeasured_arms(rungs: Sequence[RungResult]) -> list[str]:
    """A bench that measured nothing on an arm is incomplete, bar or no bar (issue 26, item 16)."""
    if not rungs:
        return ["no rung was measured"]
    out = []
    for role in ("reference", "candidate"):
        figs = [getattr(r, role) for r in rungs]
        if not any(f is not None and any(f.figure(n).samples for n in FigureName) for f in figs):
            out.append(f"nothing was measured on the {role}: every rung is not measured")
    return out
