"""Localise divergences: both arms dump the same ids, one engine at a time, then compare.

The ids are the prompt, the common prefix and the reference's token at the divergence; the
positions kept are the divergence position (the one whose logits chose the differing token)
and the n - 1 before it. The reference runs every prompt first (and, to graft, dumps each
layer's input at every position), then is released; then the candidate. Each arm's dump is
checked to choose, at the divergence, the token that arm generated (`reproduce`); where a
prefill dump does not and the engine can dump along its decode path, that dump replaces it, and
the other arm dumps along its decode path too where it can (both compared along one path).
Tensors go to files under a work directory (made absolute: engines run elsewhere) and are read
back one prompt at a time, exactly as audited, so memory holds one prompt's dump per arm; the
directory is removed unless `keep`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from strict_gate.engines.base import DumpRequest, Engine
from strict_gate.errors import EngineError
from strict_gate.judge.compare import Comparison, Status
from strict_gate.judge.localization import Localization, PointDiff, Reproduction
from strict_gate.localize.capture import Audited, capture, read_back
from strict_gate.localize.compare import compare_points, default_tolerance, first_beyond, refusal
from strict_gate.localize.points import DEFAULT_POSITIONS, OPS_DEPTH, is_op, layer_inputs, layer_of, ops_of
from strict_gate.localize.reproduce import reproduction
from strict_gate.runs.records import Record


@dataclass(frozen=True)
class Target:
    """One prompt to localise: the ids both arms run, the positions kept, and what each arm
    generated at the divergence (None: that arm's sequence ended there)."""

    prompt_id: str
    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    tokens: tuple[tuple[str, int | None], ...] = ()  # (("reference", r), ("candidate", c))
    prompt_len: int | None = None  # where the decode path starts

    def token(self, role: str) -> int | None:
        return dict(self.tokens).get(role)


@dataclass(frozen=True)
class Settings:
    points: tuple[str, ...] | None = None  # None: every point the engines give
    positions: int = DEFAULT_POSITIONS
    tolerance: float | None = None  # None: by the arms' dtypes (compare.TOLERANCES)
    graft: bool = True  # where the candidate can graft
    keep: bool = False
    narrow: bool = True  # a second pass at the ops inside the first layer beyond tolerance

    @property
    def every_op(self) -> bool:
        return self.points == (OPS_DEPTH,)

    @property
    def first_pass(self) -> tuple[str, ...] | None:
        return None if self.every_op else self.points


def target(pid: str, ref: Record, divergence: int, n: int, tokens: tuple[int | None, int | None] = (None, None)
           ) -> Target:
    ids = tuple(ref.prompt_token_ids) + tuple(ref.token_ids[: divergence + 1])
    at = len(ref.prompt_token_ids) + divergence - 1  # its logits chose token `divergence`
    return Target(pid, ids, tuple(range(max(0, at - n + 1), at + 1)),
                  (("reference", tokens[0]), ("candidate", tokens[1])), len(ref.prompt_token_ids))


def targets(comparison: Comparison, ref_records: Mapping[str, Record], *, n: int, statuses: Sequence[Status],
            only: str | None = None) -> list[Target]:
    out = []
    for p in comparison.prompts:
        d = p.first_divergence
        if d is None or (only is not None and p.id != only) or p.status not in statuses:
            continue
        out.append(target(p.id, ref_records[p.id], d.position, n, (d.reference_token, d.candidate_token)))
    return out


def engine_name(engine: Engine) -> str:
    return f"{engine.kind} {engine.info().model}"


def engine_dtype(engine: Engine) -> str | None:
    d = engine.speed_settings().get("dtype")
    return str(d) if d else None


class _Arm:
    """One arm's dumps for every target, one directory per request, each read back exactly as
    the audit saw it; per target, whether the dump compared chose this arm's token."""

    def __init__(self, engine: Engine, work: Path, role: str):
        self.engine, self.root, self.role = engine, work / role, role
        self.files: dict[tuple[str, str], Audited] = {}
        self.errors: dict[str, str] = {}
        self.checks: dict[str, Reproduction] = {}
        self.requests = 0

    def dump(self, t: Target, what: str, points, positions, graft: Path | None = None,
             decode_from: int | None = None) -> Audited | None:
        if t.prompt_id in self.errors:
            return None
        self.requests += 1
        directory = self.root / f"{self.requests:04d}-{what}"
        request = DumpRequest(t.token_ids, points, positions, directory, graft, decode_from)
        try:
            self.files[(t.prompt_id, what)] = found = capture(self.engine, request)
        except EngineError as e:
            self.errors[t.prompt_id] = str(e)
            return None
        return found

    def compared(self, t: Target, settings_points) -> None:
        """The dump to compare: prefill; the decode path's where prefill did not choose this
        arm's token and the engine can dump along it."""
        found = self.dump(t, "points", settings_points, t.positions)
        token = t.token(self.role)
        if found is None or token is None:
            return
        self.checks[t.prompt_id] = reproduction(self.engine, self.role, t, token, found.tensors, "prefill")
        if self.checks[t.prompt_id].reproduced is False:
            self.decoded(t, settings_points)

    def decoded(self, t: Target, settings_points) -> None:
        """The dump along the decode path, compared instead (and checked again), where it can."""
        token = t.token(self.role)
        if token is None or not self.engine.can_dump_decode or not t.prompt_len:
            return
        found = self.dump(t, "decode", settings_points, t.positions, decode_from=t.prompt_len)
        if found is not None:
            self.files[(t.prompt_id, "points")] = found
            self.files.pop((t.prompt_id, "grafted"), None)  # a prefill-path pass: not comparable now
            self.checks[t.prompt_id] = reproduction(self.engine, self.role, t, token, found.tensors, "decode")

    def load(self, pid: str, what: str) -> dict:
        return read_back(self.files[(pid, what)])

    def ops(self, t: Target, points: tuple[str, ...]) -> None:
        """The narrowing pass, along the path this arm's compared dump took."""
        decoded = (t.prompt_id, "decode") in self.files
        self.dump(t, "ops", points, t.positions, decode_from=t.prompt_len if decoded else None)


def localize(ts: Sequence[Target], reference: Engine, candidate: Engine, work: Path, settings: Settings,
             *, release: Callable[[Engine], None], reference_note: str | None = None) -> dict[str, Localization]:
    """Every target localised; `release(engine)` is called when an arm's dumps are done."""
    work = work.absolute()  # the engines may run elsewhere; a relative path would name another place
    ref, cand = _Arm(reference, work, "reference"), _Arm(candidate, work, "candidate")
    grafting = settings.graft and candidate.can_graft  # the class's claim; a command engine may narrow it
    try:
        for t in ts:
            ref.compared(t, settings.first_pass)
            if grafting and (t.prompt_id, "points") in ref.files:
                layers = layer_inputs(ref.load(t.prompt_id, "points"))
                ref.dump(t, "graft-source", tuple(layers), tuple(range(len(t.token_ids))))
        release(reference)
        for t in ts:
            cand.compared(t, settings.first_pass)
            # after its first dump: a command engine's hello has narrowed can_graft by then
            source = ref.files.get((t.prompt_id, "graft-source"))
            if candidate.can_graft and source is not None and (t.prompt_id, "decode") not in cand.files:
                cand.dump(t, "grafted", settings.points, t.positions, source.path)
        release(candidate)
        _same_path(ts, ref, cand, settings.first_pass, release)
        # after the dumps: a command engine says its dtype in its hello
        tol = settings.tolerance or default_tolerance(engine_dtype(reference), engine_dtype(candidate))
        found = {t.prompt_id: _one(t, ref, cand, tol, work if settings.keep else None, reference_note) for t in ts}
        return _narrowed(ts, found, ref, cand, settings, tol, release)
    finally:
        if not settings.keep:
            shutil.rmtree(work, ignore_errors=True)


def _same_path(ts: Sequence[Target], ref: _Arm, cand: _Arm, points, release: Callable[[Engine], None]) -> None:
    """Where one arm is compared along its decode path, the other is too when it can (started
    again, released again): both dumps then took the path that generated the tokens."""
    for arm, other in ((ref, cand), (cand, ref)):
        todo = [t for t in ts if (t.prompt_id, "decode") in other.files and (t.prompt_id, "decode") not in arm.files]
        for t in todo:
            arm.decoded(t, points)
        if todo and arm.engine.can_dump_decode:
            release(arm.engine)


def _narrowing(loc: Localization, settings: Settings) -> tuple[str, ...]:
    """The ops a second pass asks for: inside the first layer beyond (every layer with "ops")."""
    if loc.error is not None or not loc.points:
        return ()
    if settings.every_op:
        layers = sorted({i for i in (layer_of(p.name) for p in loc.points) if i is not None})
        return tuple(op for i in layers for op in ops_of(i))
    at = layer_of(loc.first_beyond or "")
    if not settings.narrow or at is None or is_op(loc.first_beyond or ""):
        return ()
    return ops_of(at)


def _narrowed(ts: Sequence[Target], found: dict[str, Localization], ref: _Arm, cand: _Arm, settings: Settings,
              tol: float, release: Callable[[Engine], None]) -> dict[str, Localization]:
    """The narrowing pass on both arms (each started again, released again), compared."""
    asked = {t.prompt_id: _narrowing(found[t.prompt_id], settings) for t in ts}
    todo = [t for t in ts if asked[t.prompt_id]]
    if not todo:
        return found
    for arm in (ref, cand):
        for t in todo:
            arm.ops(t, asked[t.prompt_id])
        release(arm.engine)
    out = dict(found)
    for t in todo:
        pid = t.prompt_id
        error = ref.errors.get(pid) or cand.errors.get(pid)
        try:
            if error is None and (pid, "ops") in ref.files and (pid, "ops") in cand.files:
                r, c = ref.load(pid, "ops"), cand.load(pid, "ops")
                error = refusal(r, c)
                if error is None:
                    ops = tuple(p for p in compare_points(r, c, tol) if is_op(p.name))
                    out[pid] = replace(found[pid], ops=ops)
                    continue
        except EngineError as e:
            error = str(e)
        out[pid] = replace(found[pid], reference_note=_joined(found[pid].reference_note,
                                                              f"the narrowing pass failed: {error or 'no dump'}"))
    return out


def _joined(a: str | None, b: str) -> str:
    return f"{a}; {b}" if a else b


def _one(t: Target, ref: _Arm, cand: _Arm, tol: float, kept: Path | None, note: str | None) -> Localization:
    names = engine_name(ref.engine), engine_name(cand.engine)
    checks = tuple(a.checks[t.prompt_id] for a in (ref, cand) if t.prompt_id in a.checks)
    try:
        error = ref.errors.get(t.prompt_id) or cand.errors.get(t.prompt_id)
        if error is None:
            r, c = ref.load(t.prompt_id, "points"), cand.load(t.prompt_id, "points")
            error = refusal(r, c)
    except EngineError as e:
        error = str(e)
    if error is not None:
        return Localization(t.prompt_id, t.positions, (), None, tol, *names, reference_note=note, error=error,
                            reproduction=checks)
    points = compare_points(r, c, tol)
    grafted: tuple[PointDiff, ...] = ()
    if (t.prompt_id, "grafted") in cand.files:
        try:
            layers = {k: v for k, v in cand.load(t.prompt_id, "grafted").items() if k.startswith("layers.")}
        except EngineError as e:
            return Localization(t.prompt_id, t.positions, (), None, tol, *names, reference_note=note,
                                error=str(e), reproduction=checks)
        grafted = compare_points({k: v for k, v in r.items() if k.startswith("layers.")}, layers, tol)
    return Localization(t.prompt_id, t.positions, points, first_beyond(points), tol, *names, grafted=grafted,
                        reference_note=note, kept=str(kept) if kept else None, reproduction=checks)
