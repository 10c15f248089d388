"""The speed section of every format, worded once.

It is built from `SpeedResult.to_json()`, the very object report.json holds as `speed`, so
`strict-gate show` (which has only report.json) words a finished gate exactly as the gate's own
reports did, and no format can show a figure report.json lacks. Each format only lays these
words out and escapes them its own way. A report.json can be hand-edited or come from another
version, so every field is read defensively: a missing or odd one shows as "?" or "–".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from strict_gate.judge.result import GateResult

REFERENCE_NAMES = {"vllm": "vLLM"}  # an engine kind as a reviewer names it
# (report.json key, label, unit, scale to that unit), in the order the words give them
FIGURES = (("decode_tok_s", "decode", "tok/s", 1.0), ("ttft_s", "TTFT", "ms", 1000.0),
           ("e2e_tok_s", "e2e", "tok/s", 1.0))
ORDERS = {
    "interleaved": "arms interleaved (ABBA: reference, candidate, candidate, reference, ...)",
    "sequential": "arms one after the other (one engine loaded at a time: drift of the machine lands on one arm)",
}
METHODS = {
    "stream": "TTFT and decode from one streamed request: its first token and its reply",
    "two-request": "TTFT from a separate max_tokens=1 request, decode = (n - 1) / (full request - that TTFT): "
                   "biased wherever the two requests differ in more than their length (an engine slow at "
                   "max_tokens=1 looks fast at decoding), so a decode bar holds e2e to the same bar",
}


@dataclass(frozen=True)
class Shown:
    """A median and its spread as text: "812" and "(798–820)"; a ratio: "0.91x" and "[0.88, 0.94]";
    no spread: ""; nothing measured: "–"."""

    median: str
    spread: str = ""

    def __str__(self) -> str:
        return f"{self.median} {self.spread}" if self.spread else self.median


@dataclass(frozen=True)
class FigureCells:
    """One figure of one rung: both arms and the ratio candidate/reference."""

    label: str  # "decode"
    unit: str  # "tok/s"
    reference: Shown
    candidate: Shown
    ratio: Shown  # "0.91x", "[0.88, 0.94]" its 95 % interval ("?" for an end that is not finite)
    separable: bool

    @property
    def measured(self) -> bool:
        return self.ratio.median != "–"


@dataclass(frozen=True)
class RungRow:
    name: str
    figures: tuple[FigureCells, ...]
    error: str | None  # why an arm could not be measured here

    def words(self, reference: str) -> str:
        """ "decode 0.91x vLLM [0.88, 0.94], TTFT 1.40x [0.98, 1.52] not separable, ..." """
        parts: list[str] = []
        for f in self.figures:
            if f.measured:
                name = "" if parts else f" {reference}"
                sep = "" if f.separable else " not separable"
                parts.append(f"{f.label} {f.ratio.median}{name} {f.ratio.spread}{sep}")
        text = ", ".join(parts)
        if self.error:
            text = f"{text}; not measured: {self.error}" if text else f"not measured: {self.error}"
        return text or "not measured"


@dataclass(frozen=True)
class SpeedView:
    """Everything a format shows of the speed arm, as text."""

    reference: str  # the reference engine's name: "vLLM"
    candidate: str  # the candidate engine's kind: "command"
    verdict: str  # pass | fail | incomplete | not_separable | not_comparable | tokens_not_verified | informational
    verdict_line: str  # "speed: fail (min_speed_ratio decode 0.95x)"
    reasons: tuple[str, ...]
    setup: str  # method, runs/warmup, machine
    matched: str  # "matched: yes", "matched: no (...)" or "matched: not checked (...)"
    tokens: str  # "timed tokens: 40 replies checked, all verified" or what did not verify
    mismatches: tuple[tuple[str, bool], ...]  # (words, flattering)
    rows: tuple[RungRow, ...]
    self_reported: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def legend(self) -> str:
        return (f"Each figure is the median over the runs, (min–max) its spread. A ratio is candidate / "
                f"reference ({self.reference}) of the figure: decode and e2e above 1 mean a faster candidate; "
                "a TTFT ratio below 1 is faster (its first token comes sooner). [low, high] is the ratio's 95 % "
                "interval (Hodges-Lehmann over every pair of runs, Mann-Whitney interval); one that contains "
                "1.0, or that too few runs cannot bring to 95 %, is not separable: the runs cannot tell the "
                "two engines apart. A min_speed_ratio is met only when the whole interval is at or above it.")

    def columns(self) -> list[str]:
        """The table's header: the rung, each figure for both arms by role, the ratios in words."""
        cols = ["rung"]
        for _, label, unit, _ in FIGURES:
            cols += [f"{label} {unit} reference", f"{label} {unit} candidate"]
        return cols + ["candidate / reference"]

    def kinds(self) -> list[str]:
        """The row beneath the header: each arm's engine kind under its role."""
        return ["engine", *([self.reference, self.candidate] * len(FIGURES)), f"vs {self.reference}"]

    def cells(self, row: RungRow) -> list[str]:
        out = [row.name]
        for f in row.figures:
            out += [str(f.reference), str(f.candidate)]
        return out + [row.words(self.reference)]

    def lines(self) -> list[str]:
        """The section as plain text (junit's system-out, a log)."""
        out = [self.verdict_line, *(f"  {r}" for r in self.reasons), self.setup, self.matched, self.tokens]
        out += [f"  {m}" for m, _ in self.mismatches]
        out += [f"rung {row.name}: {row.words(self.reference)}; "
                + "; ".join(f"{f.label} {f.unit} {self.reference} {f.reference}, candidate {f.candidate}"
                            for f in row.figures) for row in self.rows]
        if self.self_reported:
            out += ["self-reported by the engines (shown, never used):", *(f"  {s}" for s in self.self_reported)]
        return out + [f"note: {n}" for n in self.notes] + [self.legend]


def of(r: GateResult) -> SpeedView | None:
    """The view of a gate's speed arm, from the same JSON report.json gets."""
    speed = r.feature("speed")
    return build(speed.to_json() if speed is not None else None, r.reference.kind, r.candidate.kind)


def reference_name(kind: object) -> str:
    return REFERENCE_NAMES.get(str(kind), str(kind) if kind else "reference")


def build(speed: object, reference_kind: object, candidate_kind: object = None) -> SpeedView | None:
    """The view of report.json's `speed` object; None when there is none (or it is the old
    per-arm wall clock of a report written before `wall_clock` had its own key). The arms'
    kinds are the speed object's own `arms` where it has them (a stand-in reference)."""
    if not isinstance(speed, dict) or not isinstance(speed.get("rungs"), list):
        return None
    arms = _dict(speed.get("arms"))
    ref = reference_name(arms.get("reference") or reference_kind)
    cand = str(arms.get("candidate") or candidate_kind or "candidate")
    v = _dict(speed.get("speed_verdict"))
    verdict = str(speed.get("verdict") or v.get("verdict") or "?")
    bars = _dict(v.get("min_speed_ratio"))
    said = verdict.replace("_", " ")
    if bars:
        line = f"speed: {said} (min_speed_ratio " + ", ".join(f"{k} {_bar(x)}" for k, x in bars.items()) + ")"
    else:
        line = f"speed: {said} (no min_speed_ratio: figures only)"
    mismatches = tuple(_mismatch(_dict(m), ref) for m in _list(speed.get("mismatches")))
    fields = [str(_dict(m).get("field")) for m in _list(speed.get("mismatches"))]
    if fields:  # a ratio across mismatched configs is not meeting the reference's speed: said where the verdict is
        line += f"; config differs: {', '.join(dict.fromkeys(fields))}"
    rungs = [_dict(r) for r in _list(speed.get("rungs"))]
    method = str(speed.get("method") or "?")
    machine = str(speed.get("machine") or "not recorded")
    order = ORDERS.get(str(speed.get("order")), "order not recorded")
    setup = (f"method {method} ({METHODS.get(method, 'unknown method')}), {_int(speed.get('runs'))} runs after "
             f"{_int(speed.get('warmup'))} warmup, {order}, machine: {machine}")
    return SpeedView(
        reference=ref, candidate=cand, verdict=verdict, verdict_line=line,
        reasons=tuple(str(x) for x in _list(v.get("reasons"))),
        setup=setup, matched=_matched(speed.get("matched"), mismatches), tokens=_tokens(rungs),
        mismatches=mismatches,
        rows=tuple(_row(r) for r in rungs),
        self_reported=tuple(s for r in rungs for s in _self_reported(r, ref)),
        notes=tuple(str(x) for x in _list(speed.get("notes"))),
    )


def _matched(matched: object, mismatches: tuple[tuple[str, bool], ...]) -> str:
    """Yes only when report.json says a comparison was made and found nothing."""
    if mismatches:
        flattering = sum(1 for _, f in mismatches if f)
        return (f"matched: no ({len(mismatches)} difference{'s' if len(mismatches) != 1 else ''}"
                + (f", {flattering} flattering denominator: the ratios look better than they are, "
                   "the speed verdict cannot pass" if flattering else "") + ")")
    if matched is True:
        return "matched: yes"
    return "matched: not checked (no rung was measured on both arms)"


def _tokens(rungs: list[dict]) -> str:
    """The timed-token check over every rung, in one line."""
    if not rungs:
        return "timed tokens: not checked (no rung was measured)"
    checks = [(str(r.get("name") or "?"), _dict(r.get("token_check"))) for r in rungs]
    bad = [f"rung {name} ({_int(c.get('unverified'))} of {_int(c.get('checked'))} replies)"
           for name, c in checks if c.get("verified") is False]
    if bad:
        return "timed tokens: not verified on " + ", ".join(bad)
    checked = sum(n for _, c in checks if isinstance(n := c.get("checked"), int) and not isinstance(n, bool))
    unchecked = [f"rung {name}" for name, c in checks if c.get("verified") is not True]
    if unchecked:
        return ("timed tokens: not checked on " + ", ".join(unchecked)
                + (f"; {checked} replies checked elsewhere, all verified" if checked else ""))
    return f"timed tokens: {checked} replies checked (own gate records, or the other arm's), all verified"


def _row(r: dict) -> RungRow:
    ref, cand, ratios = _dict(r.get("reference")), _dict(r.get("candidate")), _dict(r.get("ratio"))
    figures = []
    for key, label, unit, scale in FIGURES:
        ratio = _dict(ratios.get(key))
        figures.append(FigureCells(label, unit, _figure(_dict(ref.get(key)), scale),
                                   _figure(_dict(cand.get(key)), scale), _ratio(ratio),
                                   ratio.get("separable") is True))
    error = r.get("error")
    return RungRow(str(r.get("name") or "?"), tuple(figures), None if error in (None, "") else str(error))


def _self_reported(r: dict, ref: str) -> list[str]:
    out = []
    for arm, name in (("reference", ref), ("candidate", "candidate")):
        sr = _dict(_dict(r.get(arm)).get("self_reported"))
        if sr:
            out.append(f"rung {r.get('name')} {name}: " + ", ".join(f"{k} {_value(x)}" for k, x in sr.items()))
    return out


def _mismatch(m: dict, ref: str) -> tuple[str, bool]:
    flattering = m.get("flattering") is True
    text = f"{m.get('field')}: {ref} {_value(m.get('reference'))}, candidate {_value(m.get('candidate'))}"
    if flattering:
        text += " — flattering denominator"
    if m.get("message"):
        text += f" ({m.get('message')})"
    return text, flattering


def _figure(f: dict, scale: float) -> Shown:
    """One repetition (or no spread): the median alone; nothing measured: "–"."""
    median = _num(f.get("median"))
    if median is None:
        return Shown("–")
    spread = _list(f.get("spread"))
    lo, hi = (_num(x) for x in spread) if len(spread) == 2 else (median, median)
    if lo == hi == median:
        return Shown(_n(median * scale))
    lo, hi = (None if x is None else x * scale for x in (lo, hi))
    return Shown(_n(median * scale), f"({_n(lo)}–{_n(hi)})")


def _ratio(r: dict) -> Shown:
    median = _num(r.get("median"))
    if median is None:
        return Shown("–")
    interval = _list(r.get("interval"))
    lo, hi = (_num(x) for x in interval) if len(interval) == 2 else (None, None)
    return Shown(f"{median:.2f}x", f"[{_x(lo)}, {_x(hi)}]")


def _n(x: float | None) -> str:
    """A figure with about three significant digits, never in exponent form."""
    if x is None:
        return "?"
    a = abs(x)
    return f"{x:.0f}" if a >= 100 else f"{x:.1f}" if a >= 10 else f"{x:.2f}" if a >= 1 else f"{x:.3g}"


def _x(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"  # "?": a non-finite end, null in report.json


def _bar(x: object) -> str:
    n = _num(x)
    return f"{n:g}x" if n is not None else str(x)  # the user's own bar, as written


def _int(x: object) -> str:
    return str(x) if isinstance(x, int) and not isinstance(x, bool) else "?"


def _value(x: object) -> str:
    return x if isinstance(x, str) else json.dumps(x, ensure_ascii=False, default=str)


def _num(x: object) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def _dict(x: object) -> dict:
    return x if isinstance(x, dict) else {}


def _list(x: object) -> list:
    return x if isinstance(x, list) else []
