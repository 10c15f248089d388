"""How drift (strict_gate/judge/drift.py) reads in report.md, the console and junit.xml.

Kept apart from the format modules so that each of them gains a line or two, not a section.
"""

from __future__ import annotations

from strict_gate.judge.compare import Status
from strict_gate.judge.drift import DriftReport, PromptDrift, Stats
from strict_gate.judge.prefix_drift import FLOAT32_ROUNDING_MAX, HALF_PRECISION_MAX, DriftScale
from strict_gate.judge.result import GateResult, matched_drift
from strict_gate.report.text import md

WORST_PROMPTS = 20  # rows of the per-prompt drift table in report.md


def _f(x: float | None, fmt: str = ".4g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _stats(s: Stats) -> str:
    return f"mean {_f(s.mean)}, p99 {_f(s.p99)}, max {_f(s.max)}"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _worst_first(p: PromptDrift) -> tuple:
    """Prompts where a flip is closest or happened first: top-1 differences, then drift size."""
    return (p.same_top1 - p.positions, -(p.abs_dlogprob.max or 0.0), p.min_reference_margin or 0.0)


def markdown_section(r: GateResult) -> list[str]:
    d = r.drift
    if d is None:
        return []
    out = ["## Drift before a flip", ""]
    out.append(
        f"{md(d.scored_by or 'The candidate')} scored the reference's own tokens (teacher forcing) at every "
        f"position of every prompt. |Δ logprob| is the reference token's logprob, reference minus candidate; "
        f"KL is estimated over both top-{d.k} lists (see docs/drift.md); the band is {d.band:g} nats."
    )
    out += ["", "| measure | value |", "|---|---|"]
    out.append(f"| positions scored | {d.positions} ({len(d.prompts) - len(d.missing)}/{len(d.prompts)} prompts) |")
    out.append(f"| same top-1 | {d.same_top1}/{d.positions} ({_rate(d.same_top1_rate)}) |")
    out.append(f"| abs Δ logprob (nats) | {_stats(d.abs_dlogprob)} |")
    out.append(f"| KL(ref‖cand) (nats) | {_stats(d.kl)} |")
    out.append(f"| smallest reference top-2 margin | {_f(d.min_reference_margin)} |")
    out.append(f"| positions with margin within the band | {d.positions_within_band} |")
    out.append("")
    scored = sorted((p for p in d.prompts.values() if p.error is None), key=_worst_first)
    if scored:
        shown = scored[:WORST_PROMPTS]
        out.append(f"Worst {len(shown)} of {len(scored)} prompts (top-1 differences first, then the largest |Δ|):")
        out += ["", "| prompt | same top-1 | first other top-1 | abs Δ max | abs Δ mean | KL max | min margin "
                "| within band |", "|---|---|---|---|---|---|---|---|"]
        for p in shown:
            first = "–" if p.first_top1_difference is None else str(p.first_top1_difference)
            out.append(
                f"| {md(p.id)} | {p.same_top1}/{p.positions} | {first} | {_f(p.abs_dlogprob.max)} "
                f"| {_f(p.abs_dlogprob.mean)} | {_f(p.kl.max)} | {_f(p.min_reference_margin)} "
                f"| {p.positions_within_band} |"
            )
        out.append("")
    if d.missing:
        out.append(f"No drift figures for {len(d.missing)} prompt(s) (not counted as zero drift):")
        out.append("")
        out += [f"- {md(pid)}: {md(why)}" for pid, why in list(d.missing.items())[:WORST_PROMPTS]]
        out.append("")
    return out


def near_tie_scales(r: GateResult) -> list[str]:
    """How many near-ties came with drift above float32 rounding level, and the thresholds."""
    scales = [pd.scale for p in r.comparison.prompts
              if p.status == Status.NEAR_TIE and (pd := matched_drift(r, p)) is not None]
    above = [s for s in scales if s != DriftScale.FLOAT32_ROUNDING]
    if not above:
        return []
    n_q = sum(1 for s in above if s == DriftScale.BEYOND_HALF_PRECISION)
    return [
        f"{len(above)} of {len(scales)} near-tie(s) came with drift above float32 rounding level at their matched "
        f"positions ({n_q} beyond half precision: max |Δ logprob| > {HALF_PRECISION_MAX:g} nats; the rest at "
        f"half-precision level: > {FLOAT32_ROUNDING_MAX:g}). Such a tie says the arms already disagreed everywhere; the thresholds are "
        "orders of magnitude and depend on the hardware (docs/drift.md).",
        "",
    ]


def console_line(d: DriftReport) -> str:
    line = (
        f"drift: same top-1 {d.same_top1}/{d.positions} ({_rate(d.same_top1_rate)}), "
        f"|Δ logprob| mean {_f(d.abs_dlogprob.mean, '.3g')} p99 {_f(d.abs_dlogprob.p99, '.3g')} "
        f"max {_f(d.abs_dlogprob.max, '.3g')}, KL mean {_f(d.kl.mean, '.3g')}, "
        f"min margin {_f(d.min_reference_margin, '.3g')}, {d.positions_within_band} within band"
    )
    if d.missing:
        line += f"; {len(d.missing)} prompt(s) without drift figures"
    return line


def junit_properties(d: DriftReport | None) -> list[tuple[str, str]]:
    if d is None:
        return []
    pairs = [
        ("drift_positions", d.positions),
        ("drift_same_top1_rate", d.same_top1_rate),
        ("drift_abs_dlogprob_mean", d.abs_dlogprob.mean),
        ("drift_abs_dlogprob_p99", d.abs_dlogprob.p99),
        ("drift_abs_dlogprob_max", d.abs_dlogprob.max),
        ("drift_kl_mean", d.kl.mean),
        ("drift_kl_max", d.kl.max),
        ("drift_min_reference_margin", d.min_reference_margin),
        ("drift_positions_within_band", d.positions_within_band),
        ("drift_prompts_missing", len(d.missing)),
    ]
    return [(k, "n/a" if v is None else str(v)) for k, v in pairs]
