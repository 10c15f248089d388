"""Did a dump take the path that produced the divergence? At the divergence position, the
dump's own `logits` (or, where it gives none, a score of the same prefix) must choose the token
that arm generated there; a tie that includes it counts as chosen. A dump that picks another
token ran another path (decode, batching, cache) than the one the gate saw, and comparing it
localises nothing about this divergence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strict_gate.engines.base import Engine
from strict_gate.errors import EngineError
from strict_gate.judge.localization import Reproduction
from strict_gate.localize.compare import point_diff
from strict_gate.localize.points import in_depth_order


def reproduction(engine: Engine, role: str, t: Any, token: int, tensors: Mapping[str, Any], path: str
                 ) -> Reproduction:
    """One arm's check at the last kept position (the divergence's)."""
    logits = tensors.get("logits")
    if logits is not None:
        row = logits[-1]
        if not 0 <= token < row.shape[0]:
            return Reproduction(role, token, int(row.argmax()), f"logits, {row.shape[0]} wide", path)
        chosen = token if float(row[token]) >= float(row.max()) else int(row.argmax())
        return Reproduction(role, token, chosen, "its dumped logits", path)
    if not engine.can_score:
        return Reproduction(role, token, None, "no logits in its dump and it cannot score", path)
    at = t.positions[-1]
    try:
        step = engine.score(t.token_ids[: at + 1], [token], 1)[0]
    except (EngineError, IndexError) as e:
        return Reproduction(role, token, None, f"no logits in its dump and its score failed: {e}", path)
    if not step.top:
        return Reproduction(role, token, None, "no logits in its dump and its score gave no top-1", path)
    best_id, best = step.top[0]
    tie = step.logprob is not None and best is not None and step.logprob >= best
    return Reproduction(role, token, token if tie else int(best_id), "a score of the same prefix", "prefill")


def decode_mismatch(prefill: Mapping[str, Any], decoded: Mapping[str, Any], positions: tuple[int, ...],
                    decode_from: int, tolerance: float) -> str | None:
    """Why a decode dump's rows before `decode_from` are not its own prefill dump's, in words, or
    None. Those rows are a prefill of ids[:decode_from] by the protocol, and causal attention makes
    them the full prefill's rows: a decode dump that differs there ignored decode_from, or is of
    other positions or ids; one that lacks a point its prefill dump gave is not of the points asked."""
    rows = [i for i, p in enumerate(positions) if p < decode_from]
    missing = [n for n in in_depth_order(prefill) if n not in decoded]
    if missing:
        return f"lacks {', '.join(missing)}, which its prefill dump gives: it is not of the points asked"
    if not rows:
        return None
    for name in in_depth_order(set(prefill) & set(decoded)):
        a, b = prefill[name], decoded[name]
        if tuple(a.shape) != tuple(b.shape):
            return f"has {name} of shape {tuple(b.shape)} where its prefill dump's is {tuple(a.shape)}"
        d = point_diff(name, a[rows], b[rows], tolerance)
        if d.beyond:
            return (f"differs from its own prefill dump at positions before decode_from {decode_from} ({name}: "
                    f"rel_diff {d.rel_diff:.3g} over positions {[positions[i] for i in rows]}, tolerance "
                    f"{tolerance:g}): those rows are a prefill by the protocol, so it did not run the path asked "
                    "(decode_from ignored, or other positions or ids)")
    return None
