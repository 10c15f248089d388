"""The narrowing pass: when a layer is first beyond tolerance, both arms dump the ops inside it
(every op of every layer with `--points ops`), and, where the candidate can graft at ops, the
candidate dumps them once more fed the reference's inputs (localize/graft.py), so the report
says whether the first op beyond is wrong alone or follows drift from earlier.

Each engine is started again (the localisation released it after its first pass) and the ops
are dumped along the path each arm's compared dump took. To graft, the reference dumps the ops
and the layer's input at every position (attention reads them all); the rows compared are the
kept positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from strict_gate.engines.base import Engine
from strict_gate.errors import EngineError
from strict_gate.judge.localization import Localization, PointDiff
from strict_gate.localize.arm import Arm, Settings, Target
from strict_gate.localize.compare import compare_points, refusal
from strict_gate.localize.graft import ignored, layers_of, source_points, verdicts, write_graft
from strict_gate.localize.points import is_op, layer_of, ops_of


def narrowing(loc: Localization, settings: Settings) -> tuple[str, ...]:
    """The ops a second pass asks for: inside the first layer beyond (every layer with "ops")."""
    if loc.error is not None or not loc.points:
        return ()
    if settings.every_op:
        return tuple(op for i in layers_of(p.name for p in loc.points) for op in ops_of(i))
    at = layer_of(loc.first_beyond or "")
    if not settings.narrow or at is None or is_op(loc.first_beyond or ""):
        return ()
    return ops_of(at)


def _rows(tensors: dict, positions: tuple[int, ...]) -> dict:
    """The kept positions' rows of a dump taken at every position."""
    return {k: v[list(positions)] for k, v in tensors.items()}


def _ops_only(tensors: dict) -> dict:
    return {k: v for k, v in tensors.items() if is_op(k)}


class _Pass:
    def __init__(self, ref: Arm, cand: Arm, settings: Settings, work: Path):
        self.ref, self.cand, self.work = ref, cand, work
        self.grafting = settings.graft and cand.engine.can_graft_ops  # the hello has narrowed it by now
        self.graft_failed: dict[str, str] = {}

    def reference(self, t: Target, ops: tuple[str, ...]) -> None:
        decode_from = t.prompt_len if self.ref.decoded(t.prompt_id) else None
        if self.grafting:
            self.ref.dump(t, "ops", source_points(ops), tuple(range(len(t.token_ids))), decode_from=decode_from)
        else:
            self.ref.dump(t, "ops", ops, t.positions, decode_from=decode_from)

    def candidate(self, t: Target, ops: tuple[str, ...], index: int) -> None:
        decode_from = t.prompt_len if self.cand.decoded(t.prompt_id) else None
        found = self.cand.dump(t, "ops", ops, t.positions, decode_from=decode_from)
        if not self.grafting or found is None or (t.prompt_id, "ops") not in self.ref.files:
            return
        try:
            source = self.ref.load(t.prompt_id, "ops")
            path = write_graft(source, layers_of(ops), self.work / "op-graft" / f"{index:04d}.safetensors")
        except (EngineError, OSError) as e:
            self.graft_failed[t.prompt_id] = str(e)
            return
        self.cand.dump(t, "op-grafted", tuple(p for p in ops if is_op(p)), t.positions, graft=path,
                       decode_from=decode_from, fatal=False)
        if (why := self.cand.failed.get((t.prompt_id, "op-grafted"))) is not None:
            self.graft_failed[t.prompt_id] = why

    def compared(self, t: Target, loc: Localization, tol: float) -> Localization:
        pid = t.prompt_id
        r = self.ref.load(pid, "ops")
        r = _rows(r, t.positions) if self.grafting else r
        c = self.cand.load(pid, "ops")
        if (error := refusal(r, c)) is not None:
            raise EngineError(error)
        ops = tuple(p for p in compare_points(r, c, tol) if is_op(p.name))
        return replace(loc, ops=ops, **self._grafted(t, loc, ops, r, c, tol))

    def _grafted(self, t: Target, loc: Localization, ops: tuple[PointDiff, ...], r: dict, c: dict, tol: float
                 ) -> dict:
        pid = t.prompt_id
        if not self.grafting:
            why = ("not grafted: the candidate cannot graft at ops (no graft_ops)" if self.ref.settings.graft
                   else None)
            return {"op_graft_note": why}
        if pid in self.graft_failed or (pid, "op-grafted") not in self.cand.files:
            return {"op_graft_note": f"not grafted: {self.graft_failed.get(pid, 'no grafted dump')}"}
        g = self.cand.load(pid, "op-grafted")
        diffs = {p.name: p for p in (*loc.points, *ops)}
        if (why := ignored(c, g, diffs)) is not None:
            return {"op_graft_note": f"refused: {why}", "op_graft_refused": True}
        grafted = tuple(p for p in compare_points(_ops_only(r), _ops_only(g), tol) if p.name in g)
        compared = {p.name for p in loc.points if p.rel_diff is not None}
        return {"ops_grafted": grafted, "alone": verdicts(ops, grafted, set(r) | compared, set(c) | compared)}


def narrowed(ts: Sequence[Target], found: dict[str, Localization], ref: Arm, cand: Arm, settings: Settings,
             tol: float, release: Callable[[Engine], None], work: Path) -> dict[str, Localization]:
    """The narrowing pass on both arms (each started again, released again), compared."""
    asked = {t.prompt_id: narrowing(found[t.prompt_id], settings) for t in ts}
    todo = [t for t in ts if asked[t.prompt_id]]
    if not todo:
        return found
    run = _Pass(ref, cand, settings, work)
    for t in todo:
        run.reference(t, asked[t.prompt_id])
    release(ref.engine)
    for index, t in enumerate(todo):
        run.candidate(t, asked[t.prompt_id], index)
    release(cand.engine)
    out = dict(found)
    for t in todo:
        pid = t.prompt_id
        error = ref.errors.get(pid) or cand.errors.get(pid)
        try:
            if error is None and (pid, "ops") in ref.files and (pid, "ops") in cand.files:
                out[pid] = run.compared(t, found[pid], tol)
                continue
        except EngineError as e:
            error = str(e)
        out[pid] = replace(found[pid], reference_note=_joined(found[pid].reference_note,
                                                              f"the narrowing pass failed: {error or 'no dump'}"))
    return out


def _joined(a: str | None, b: str) -> str:
    return f"{a}; {b}" if a else b
