"""A divergence's gaps as every format writes them: each side's decode-time gap and, where
re-scoring (teacher forcing on the common prefix) gave another figure, that one beside it,
signed. The reasons quote the re-scored gaps, so a cell that gave the decode-time one alone
could read 0.000 where its reason says -0.0625 (a bfloat16 arm's exact decode tie that its
prefill ranks the other way round)."""

from __future__ import annotations

from strict_gate.judge.compare import Divergence, Rescored

RESCORED_WORD = "re-scored"
ARROW = "→"  # the console's compact pair: decode-time → re-scored


def rescored_gap(r: Rescored | None) -> float | None:
    return None if r is None else r.gap


def gap_text(decode: float | None, rescored: float | None, digits: int = 4, *, compact: bool = False) -> str:
    """One side's cell: the decode-time gap ("n/a": the other token outside its top-k), then the
    re-scored gap when it is known and reads otherwise at `digits`: "0.0000 (re-scored -0.0625)",
    compact "0.000→-0.062"."""
    a = "n/a" if decode is None else f"{decode:.{digits}f}"
    if rescored is None:
        return a
    b = f"{rescored:.{digits}f}"
    if b == a:
        return a
    return f"{a}{ARROW}{b}" if compact else f"{a} ({RESCORED_WORD} {b})"


def gap_cells(d: Divergence, digits: int = 4, *, compact: bool = False) -> tuple[str, str]:
    """(reference, candidate) cells of a divergence."""
    return (gap_text(d.reference_gap, rescored_gap(d.reference_rescored), digits, compact=compact),
            gap_text(d.candidate_gap, rescored_gap(d.candidate_rescored), digits, compact=compact))


LEGEND = (f"a gap cell \"a ({RESCORED_WORD} b)\": a from that side's decode-time top-k, b from re-scoring it "
          "on the common prefix (teacher forcing), where the two differ; a negative re-scored gap is that side's "
          "prefill ranking the tie the other way round than its decode did")
