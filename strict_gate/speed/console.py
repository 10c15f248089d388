"""The ladder in the terminal (`strict-gate bench`): medians per arm, ratios, the verdict.

A compact table that fits 80 columns; the full figures (spreads, samples) are in speed.json.
A ratio whose spread contains 1.0 is marked `~`: the repetitions cannot tell the arms apart.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from strict_gate.speed.model import FigureName, Figure, RungResult, SpeedResult, speed_ratio


def _fig(f: Figure | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if f is None or f.median is None else f"{f.median * scale:.{digits}f}"


def _ratio(rung: RungResult, name: FigureName) -> str:
    got = speed_ratio(rung, name)
    if got is None:
        return "-"
    return f"{got:.2f}x" + ("" if rung.ratio(name).separable else "~")


def ladder_table(result: SpeedResult) -> Table:
    t = Table(title=f"speed ladder ({result.method.value}, {result.runs} runs after {result.warmup} warm-up)",
              title_justify="left")
    for col in ("rung", "TTFT ms ref", "cand", "x", "decode tok/s ref", "cand", "x", "e2e x"):
        t.add_column(col, justify="left" if col == "rung" else "right")
    for r in result.rungs:
        ref, cand = r.reference, r.candidate
        t.add_row(
            r.rung.name,
            _fig(ref and ref.ttft_s, 1000), _fig(cand and cand.ttft_s, 1000), _ratio(r, FigureName.TTFT),
            _fig(ref and ref.decode_tok_s), _fig(cand and cand.decode_tok_s), _ratio(r, FigureName.DECODE),
            _ratio(r, FigureName.E2E),
        )
    return t


def print_speed(result: SpeedResult, console: Console, path: str | None = None) -> None:
    console.print(ladder_table(result))
    console.print("x: candidate speed / reference speed (>1: candidate faster; TTFT inverted); "
                  "~: spread contains 1.0")
    for r in result.rungs:
        if r.error:
            console.print(f"rung {r.rung.name}: not measured: {r.error}")
    for m in result.mismatches:
        flag = " (flattering)" if m.flattering else ""
        console.print(f"mismatch{flag}: {m.field}: reference {m.reference!r}, candidate {m.candidate!r}: {m.message}")
    for n in result.notes:
        console.print(f"note: {n}")
    v = result.verdict
    bar = ", ".join(f"{k} >= {x:g}x" for k, x in v.min_speed_ratio.items())
    console.print(f"speed verdict: {v.kind.value.upper()}" + (f" ({bar})" if bar else ""))
    for reason in v.reasons:
        console.print(f"  {reason}")
    console.print(f"machine: {result.machine}")
    if path:
        console.print(f"wrote {path}")
