"""How drift (measure.py) reads in report.md, the console, junit.xml and report.html, and its
`SECTION` in report/sections.py's registry.

report.html reads report.json's "drift" object defensively (it may be absent or partial): a
section is drawn from what is there and omitted when nothing is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from strict_gate.drift.measure import DriftReport, PromptDrift, Stats
from strict_gate.judge.result import GateResult
from strict_gate.report.html_prompt import escape
from strict_gate.report.sections import Section
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


def of(r: GateResult) -> DriftReport | None:
    d = r.feature("drift")
    return d if isinstance(d, DriftReport) else None


def markdown_section(r: GateResult) -> list[str]:
    d = of(r)
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


def _value(v: object) -> str | None:
    if isinstance(v, bool) or v is None:
        return None if v is None else str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else None
    if isinstance(v, str):
        return escape(v)
    return None


def flat_figures(figures: dict, prefix: str = "") -> list[tuple[str, str]]:
    """(key, escaped value) pairs, nested objects as a.b; lists and unknown types left out."""
    out: list[tuple[str, str]] = []
    for k, v in figures.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += flat_figures(v, key + ".")
        elif (text := _value(v)) is not None:
            out.append((key, text))
    return out


def drift_section(drift: object) -> str:
    """The gate's drift totals (report.json's "drift", without its per-prompt part)."""
    if not isinstance(drift, dict):
        return ""
    totals = drift["totals"] if isinstance(drift.get("totals"), dict) else {
        k: v for k, v in drift.items() if k != "prompts"}
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{v}</td></tr>" for k, v in flat_figures(totals))
    if not rows:
        return ""
    return ("<h2>Drift</h2><p>How far the candidate's logprobs sit from the reference's where the tokens agree.</p>"
            f"<table class='kv'>{rows}</table>")


def prompt_drift(figures: object) -> str:
    """One prompt's drift figures in a line (report.json's drift["prompts"][id])."""
    items = "; ".join(f"{escape(k)} {v}" for k, v in flat_figures(figures)) if isinstance(figures, dict) else ""
    return f"<p class='drift'><b>drift:</b> {items}</p>" if items else ""


def drift_json(r: GateResult) -> Any:
    """report.json's "drift", which report.html lays out (the gate's totals, each prompt's figures)."""
    d = of(r)
    return d.to_json() if d is not None else None


def _prompts(r: GateResult) -> Mapping[str, str]:
    drift = drift_json(r)
    per_prompt = drift["prompts"] if isinstance(drift, dict) and isinstance(drift.get("prompts"), dict) else {}
    return {pid: prompt_drift(figures) for pid, figures in per_prompt.items()}


SECTION = Section(
    "drift",
    markdown=lambda r, dec: markdown_section(r),
    html_head=lambda r: drift_section(drift_json(r)),
    html_prompts=_prompts,
    console_lines=lambda r: [] if (d := of(r)) is None else [console_line(d)],
    junit_properties=lambda r: junit_properties(of(r)),
)
