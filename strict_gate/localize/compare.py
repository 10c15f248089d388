"""Compare two arms' activations point by point along the depth.

rel_diff = 1 - 2Σxy/(Σx²+Σy²) (SGLang's dumper uses it): 0 for equal tensors, 1 for orthogonal
ones, and about e²/2 for a relative L2 error e, so it is scale-free and squared. The tolerance
is on rel_diff, per dtype pair; the defaults and the measurements behind them are in
docs/localize.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from strict_gate.errors import ConfigError
from strict_gate.judge.localization import PointDiff
from strict_gate.localize.points import in_depth_order, is_exact, layer_of

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
    """One point's figures; a shape mismatch is not comparable, and says so; a figure that is
    not finite is beyond (never 0: NaN compares false with everything)."""
    if tuple(ref.shape) != tuple(cand.shape):
        return PointDiff(name, note=f"not comparable: shapes differ (reference {tuple(ref.shape)}, "
                                    f"candidate {tuple(cand.shape)})")
    x, y = ref.double().flatten(), cand.double().flatten()
    sxx, syy, sxy = float((x * x).sum()), float((y * y).sum()), float((x * y).sum())
    rel = 0.0 if sxx + syy == 0 else 1.0 - 2.0 * sxy / (sxx + syy)
    if not math.isfinite(rel):
        return PointDiff(name, rel_diff=float("nan"), beyond=True, note="not finite: NaN or infinity in a tensor")
    rel = max(0.0, rel)
    if is_exact(name):
        return _exact(name, x, y, rel)
    cos = 1.0 if sxx == 0 and syy == 0 else (sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0)
    return PointDiff(
        name=name,
        max_abs=float((x - y).abs().max()) if x.numel() else 0.0,
        rel_diff=rel,
        cosine=cos,
        scale=(sxx / x.numel()) ** 0.5 if x.numel() else 0.0,
        beyond=rel > tolerance,
    )


def _exact(name: str, x: Any, y: Any, rel: float) -> PointDiff:
    """Ids (the chosen experts): equal or beyond, whatever the rel_diff; the note says why, so
    that no line reads "beyond" beside a rel_diff within tolerance without its reason."""
    differ = int((x != y).sum())
    return PointDiff(name=name, max_abs=float((x - y).abs().max()) if x.numel() else 0.0, rel_diff=rel,
                     cosine=None, scale=None, beyond=differ > 0,
                     note=f"compared exactly (ids): {differ} of {x.numel()} differ" if differ else None)


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


def refusal(ref: Mapping[str, Any], cand: Mapping[str, Any]) -> str | None:
    """Why two dumps cannot be compared at all, in words, or None. A point of differing width is
    not the same point; a layer the reference's model lacks is not a point of this model; embed
    rows are a table lookup (they differ by rounding only), so rows far from the reference's are
    of other positions or other ids, and blaming `embed` for them would be a false localisation."""
    widths = [f"{n} (reference {tuple(ref[n].shape)}, candidate {tuple(cand[n].shape)})"
              for n in in_depth_order(set(ref) & set(cand)) if tuple(ref[n].shape) != tuple(cand[n].shape)]
    if widths:
        return f"the candidate's dump is not of the reference's points: shapes differ at {', '.join(widths)}"
    depths = [i for i in map(layer_of, ref) if i is not None]
    depth = max(depths) if depths else None
    extra = [n for n in in_depth_order(cand) if depth is not None and (layer_of(n) or 0) > depth]
    if extra:
        return f"the candidate dumps {', '.join(extra)}, of layers the model lacks (its last layer is {depth})"
    if "embed" in ref and "embed" in cand:
        return _embed_rows(ref["embed"], cand["embed"])
    return None


EMBED_ROWS = 1e-2  # rel_diff per embed row: far beyond any dtype's rounding of a table lookup


def _embed_rows(ref: Any, cand: Any) -> str | None:
    def rel(a: Any, b: Any) -> float:
        a, b = a.double(), b.double()
        s = float((a * a).sum() + (b * b).sum())
        return 0.0 if s == 0 else 1.0 - 2.0 * float((a * b).sum()) / s

    wrong = [i for i in range(cand.shape[0]) if rel(ref[i], cand[i]) > EMBED_ROWS]
    if not wrong:
        return None
    moved = [(i, j) for i in wrong for j in range(ref.shape[0]) if rel(ref[j], cand[i]) <= EMBED_ROWS]
    if moved:
        i, j = moved[0]
        return (f"the candidate's embed row {i} matches the reference's row {j} (of {len(wrong)} rows that differ "
                "from the reference's by more than rounding): the dump is of other positions (or ids that recur)")
    return (f"the candidate's embed rows {wrong} match no row of the reference's (rel_diff {rel(ref[wrong[0]], cand[wrong[0]]):.3g} "
            "at the first): the dump is of other ids or of positions outside those asked")


def first_beyond(points: tuple[PointDiff, ...]) -> str | None:
    return next((p.name for p in points if p.beyond), None)
