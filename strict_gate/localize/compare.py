"""Compare two arms' activations point by point along the depth.

rel_diff = 1 - 2Σxy/(Σx²+Σy²) (SGLang's dumper uses it): 0 for equal tensors, 1 for orthogonal
ones, and about e²/2 for a relative L2 error e, so it is scale-free and squared. The tolerance
is on rel_diff, per dtype pair; the defaults and the measurements behind them are in
docs/localize.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strict_gate.errors import ConfigError
from strict_gate.judge.localization import PointDiff
from strict_gate.localize.points import in_depth_order

# rel_diff tolerance by the pair of dtypes the two arms computed in (order does not matter).
TOLERANCES: dict[frozenset[str], float] = {
    frozenset({"float32"}): 1e-10,
    frozenset({"float32", "float16"}): 1e-5,
    frozenset({"float16"}): 1e-5,
    frozenset({"float32", "bfloat16"}): 1e-3,
    frozenset({"bfloat16"}): 1e-3,
    frozenset({"float16", "bfloat16"}): 1e-3,
}
FALLBACK_TOLERANCE = 1e-3  # a dtype not in the table (quantised builds, "auto"): the loosest


def default_tolerance(reference_dtype: str | None, candidate_dtype: str | None) -> float:
    return TOLERANCES.get(frozenset({reference_dtype or "?", candidate_dtype or "?"}), FALLBACK_TOLERANCE)


def check_tolerance(x: float) -> float:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 < float(x) < 1:
        raise ConfigError(f"localize tolerance must be a number in (0, 1) (a rel_diff), got {x!r}")
    return float(x)


def point_diff(name: str, ref: Any, cand: Any, tolerance: float) -> PointDiff:
    """One point's figures; a shape mismatch is not comparable, and says so."""
    if tuple(ref.shape) != tuple(cand.shape):
        return PointDiff(name, note=f"not comparable: shapes differ (reference {tuple(ref.shape)}, "
                                    f"candidate {tuple(cand.shape)})")
    x, y = ref.double().flatten(), cand.double().flatten()
    sxx, syy, sxy = float((x * x).sum()), float((y * y).sum()), float((x * y).sum())
    rel = 0.0 if sxx + syy == 0 else max(0.0, 1.0 - 2.0 * sxy / (sxx + syy))
    cos = 1.0 if sxx == 0 and syy == 0 else (sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0)
    return PointDiff(
        name=name,
        max_abs=float((x - y).abs().max()) if x.numel() else 0.0,
        rel_diff=rel,
        cosine=cos,
        scale=(sxx / x.numel()) ** 0.5 if x.numel() else 0.0,
        beyond=rel > tolerance,
    )


def compare_points(ref: Mapping[str, Any], cand: Mapping[str, Any], tolerance: float) -> tuple[PointDiff, ...]:
    """Every point either arm gave, in depth order; one arm's absent point is named as such."""
    out = []
    for name in in_depth_order([*ref, *cand]):
        if name not in cand:
            out.append(PointDiff(name, note="absent on the candidate"))
        elif name not in ref:
            out.append(PointDiff(name, note="absent on the reference"))
        else:
            out.append(point_diff(name, ref[name], cand[name], tolerance))
    return tuple(out)


def first_beyond(points: tuple[PointDiff, ...]) -> str | None:
    return next((p.name for p in points if p.beyond), None)
