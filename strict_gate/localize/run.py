"""Localise divergences: both arms dump the same ids, one engine at a time, then compare.

The ids are the prompt, the common prefix and the reference's token at the divergence; the
positions kept are the divergence position (the one whose logits chose the differing token)
and the n - 1 before it. The reference runs every prompt first (and, to graft, dumps each
layer's input at every position), then is released; then the candidate. Each arm's dump is
checked to choose, at the divergence, the token that arm generated, along the path the mode
asks (localize/arm.py); in `auto`, where one arm's compared dump took its decode path, the other
arm dumps along its decode path too where it can (both compared along one path); `both` localises each path on its own and puts the decode path's
result beside the prefill one. A layer first beyond tolerance is narrowed to its ops
(localize/narrow.py). Tensors go to files under a work directory (made absolute: engines run
elsewhere) and are read back one prompt at a time, exactly as audited, so memory holds one
prompt's dump per arm; the directory is removed unless `keep`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from strict_gate.engines.base import Engine
from strict_gate.errors import EngineError
from strict_gate.judge.localization import Localization, PointDiff
from strict_gate.localize.arm import (
    Arm,
    DumpMode,
    Settings,
    Target,
    engine_dtype,
    engine_name,
    parse_mode,
    target,
    targets,
)
from strict_gate.localize.compare import compare_points, default_tolerance, first_beyond, refusal
from strict_gate.localize.narrow import narrowed
from strict_gate.localize.points import layer_inputs

__all__ = ["DumpMode", "Settings", "Target", "localize", "parse_mode", "target", "targets"]


def localize(ts: Sequence[Target], reference: Engine, candidate: Engine, work: Path, settings: Settings,
             *, release: Callable[[Engine], None], reference_note: str | None = None) -> dict[str, Localization]:
    """Every target localised; `release(engine)` is called when an arm's dumps are done."""
    work = work.absolute()  # the engines may run elsewhere; a relative path would name another place
    if settings.mode is not DumpMode.BOTH:
        return _localize(ts, reference, candidate, work, settings, release, reference_note)
    paths = [_localize(ts, reference, candidate, work / mode, replace(settings, mode=mode), release, reference_note)
             for mode in (DumpMode.PREFILL, DumpMode.DECODE)]
    if not settings.keep:
        shutil.rmtree(work, ignore_errors=True)
    return {pid: replace(loc, dump_mode=str(DumpMode.BOTH), decode=paths[1][pid]) for pid, loc in paths[0].items()}


def _localize(ts: Sequence[Target], reference: Engine, candidate: Engine, work: Path, settings: Settings,
              release: Callable[[Engine], None], reference_note: str | None) -> dict[str, Localization]:
    ref, cand = Arm(reference, work, "reference", settings), Arm(candidate, work, "candidate", settings)
    grafting = settings.graft and candidate.can_graft  # the class's claim; a command engine may narrow it
    try:
        for t in ts:
            ref.compared(t)
            if grafting and (t.prompt_id, "points") in ref.files:
                layers = layer_inputs(ref.load(t.prompt_id, "points"))
                ref.dump(t, "graft-source", tuple(layers), tuple(range(len(t.token_ids))))
        release(reference)
        for t in ts:
            cand.compared(t)
            # after its first dump: a command engine's hello has narrowed can_graft by then
            source = ref.files.get((t.prompt_id, "graft-source"))
            if candidate.can_graft and source is not None and not cand.decoded(t.prompt_id):
                cand.dump(t, "grafted", settings.points, t.positions, source.path)
        release(candidate)
        if settings.mode is DumpMode.AUTO:
            _same_path(ts, ref, cand, release)
        # after the dumps: a command engine says its dtype in its hello
        tol = settings.tolerance or default_tolerance(engine_dtype(reference), engine_dtype(candidate))
        kept = work if settings.keep else None
        found = {t.prompt_id: _one(t, ref, cand, tol, kept, reference_note) for t in ts}
        return narrowed(ts, found, ref, cand, settings, tol, release, work)
    finally:
        if not settings.keep:
            shutil.rmtree(work, ignore_errors=True)


def _same_path(ts: Sequence[Target], ref: Arm, cand: Arm, release: Callable[[Engine], None]) -> None:
    """Where one arm is compared along its decode path, the other is too when it can (started
    again, released again): both compared dumps then took the path that generated the tokens.
    The grafted dump is a prefill-path pass: not comparable once either arm is decoded."""
    for arm, other in ((ref, cand), (cand, ref)):
        todo = [t for t in ts if other.decoded(t.prompt_id) and not arm.decoded(t.prompt_id)]
        for t in todo:
            arm.decode_instead(t)
        if todo and arm.engine.can_dump_decode:
            release(arm.engine)
    for t in ts:
        if ref.decoded(t.prompt_id) or cand.decoded(t.prompt_id):
            cand.files.pop((t.prompt_id, "grafted"), None)


def _one(t: Target, ref: Arm, cand: Arm, tol: float, kept: Path | None, note: str | None) -> Localization:
    names = engine_name(ref.engine), engine_name(cand.engine)
    checks = tuple(a.checks[t.prompt_id] for a in (ref, cand) if t.prompt_id in a.checks)
    mode = str(ref.settings.mode)
    try:
        error = ref.errors.get(t.prompt_id) or cand.errors.get(t.prompt_id)
        if error is None:
            r, c = ref.load(t.prompt_id, "points"), cand.load(t.prompt_id, "points")
            error = refusal(r, c)
    except EngineError as e:
        error = str(e)
    if error is not None:
        return Localization(t.prompt_id, t.positions, (), None, tol, *names, reference_note=note, error=error,
                            reproduction=checks, dump_mode=mode)
    points = compare_points(r, c, tol)
    grafted: tuple[PointDiff, ...] = ()
    if (t.prompt_id, "grafted") in cand.files:
        try:
            layers = {k: v for k, v in cand.load(t.prompt_id, "grafted").items() if k.startswith("layers.")}
        except EngineError as e:
            return Localization(t.prompt_id, t.positions, (), None, tol, *names, reference_note=note,
                                error=str(e), reproduction=checks, dump_mode=mode)
        grafted = compare_points({k: v for k, v in r.items() if k.startswith("layers.")}, layers, tol)
    return Localization(t.prompt_id, t.positions, points, first_beyond(points), tol, *names, grafted=grafted,
                        reference_note=note, kept=str(kept) if kept else None, reproduction=checks, dump_mode=mode)
