"""Numbers printed beside their limits, shared by the near-tie band and the speed bars."""

from __future__ import annotations


def fmt_vs(x: float, limit: float, min_digits: int = 4) -> tuple[str, str]:
    """Both numbers with just enough decimals to tell them apart ("0.50001 > band 0.5")."""
    for digits in range(min_digits, 18):
        a, b = f"{x:.{digits}f}", f"{limit:.{digits}f}"
        if a != b:
            return a, f"{limit:g}" if float(f"{limit:g}") == limit else b
    return repr(x), repr(limit)
