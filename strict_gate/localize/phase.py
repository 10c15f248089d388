"""Localisation in a gate: `localize = true | "all"` (or a [localize] table), and
`strict-gate localize REPORT_DIR` on a finished one (docs/localize.md).

The activation reference is the reference arm when it can dump; else the [localize] table's
own arm ([localize.reference]), else the [rescorer]: a stored baseline has no activations,
and the report says which engine stood in.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec

from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError, EngineError, InputError
from strict_gate.gate.feature import build_rescorer
from strict_gate.judge import restore
from strict_gate.judge.localization import Localization
from strict_gate.judge.result import GateResult
from strict_gate.judge.schema import ReportDoc
from strict_gate.localize.compare import check_tolerance
from strict_gate.localize.config import Scope, of
from strict_gate.localize.points import parse_points
from strict_gate.localize.run import DumpMode, Settings, localize, parse_mode, targets
from strict_gate.runs.layout import ReportDir

WORK_DIR = "localize"  # under the report directory; removed unless keep


def activation_reference(cfg, reference: Engine, report_dir: Path) -> tuple[Engine | None, bool, str | None]:
    """(engine, built here, note): who gives the reference activations, and why when it is not
    the reference arm; (None, False, why) when nobody can. An arm built here logs into the
    report directory (localize-reference.log, rescorer.log), not to a temp file nobody finds."""
    lc = of(cfg)
    if lc is not None and lc.reference is not None:
        e = lc.reference.build()
        e.set_log_path(ReportDir(report_dir).localize_reference_log)
        return e, True, f"activation reference: the [localize.reference] arm ({e.kind} {e.info().model})"
    if reference.can_dump:
        return reference, False, None
    if cfg.rescorer is not None and cfg.rescorer.engine_type.can_dump:
        e = build_rescorer(cfg, report_dir)
        return e, True, (f"the reference ({reference.kind}) cannot dump activations: the [rescorer] arm "
                         f"({e.kind} {e.info().model}) is the activation reference")
    if reference.pooled:
        return None, False, _not_pooled("reference", reference) + " or give a [localize.reference] arm"
    return None, False, (f"not localised: the reference ({reference.kind}) cannot dump activations and no "
                         "[localize.reference] or dumping [rescorer] arm is configured")


def _not_pooled(role: str, e: Engine) -> str:
    """Why an arm served by Ray actors is not localised (localisation drives one engine)."""
    assert e.pooled is not None
    return (f"not localised: the {role} ({e.kind}) is {e.pooled.replace('<role>', role)}, and localisation "
            "drives one engine's activations (not pooled): localise with the arm without its ray table")


def _work_dir(report_dir: Path) -> Path:
    path, n = report_dir / WORK_DIR, 1
    while path.exists():
        n += 1
        path = report_dir / f"{WORK_DIR}-{n}"
    return path


def localize_result(cfg, result: GateResult, reference: Engine, candidate: Engine, report_dir: Path, *,
                    owned: set[str], scope: Scope, settings: Settings, only: str | None = None) -> GateResult:
    """The gate's localisation phase: every divergent prompt, a near-tie that diverges later at
    that later position (and the other near-ties with "all")."""
    ts = targets(result.comparison, result.reference_records, n=settings.positions, statuses=scope.statuses,
                 only=only, later=result.later, cand_records=result.candidate_records)
    if not ts:
        return result
    if candidate.pooled:
        return replace(result, notes=(*result.notes, _not_pooled("candidate", candidate)))
    ref_engine, built, note = activation_reference(cfg, reference, report_dir)
    if ref_engine is None or not candidate.can_dump:
        why = f"not localised: the candidate ({candidate.kind}) cannot dump activations"
        return replace(result, notes=(*result.notes, note if ref_engine is None and note else why))
    closable = {id(candidate)} if "candidate" in owned else set()
    if built or "reference" in owned:
        closable.add(id(ref_engine))

    def release(engine: Engine) -> None:
        if id(engine) in closable:
            engine.close()

    try:
        found = localize(ts, ref_engine, candidate, _work_dir(report_dir), settings, release=release,
                         reference_note=note)
    finally:
        if built:
            ref_engine.close()
    failed = [f"localisation of prompt {pid!r} failed: {e}" for pid, loc in found.items() for e in failures(loc)]
    return replace(result, localization={**result.localization, **found}, notes=result.notes + tuple(failed))


def relocalize(report_dir: str | Path, *, prompt: str | None = None, points: str | None = None,
               positions: int | None = None, tolerance: float | None = None, keep: bool = False,
               graft: bool = True, narrow: bool = True, mode: str | None = None):
    """`strict-gate localize REPORT_DIR`: localise a finished gate's divergences and rewrite its
    reports in place through the one rewrite (gate/rewrite.py): its verdict and diagnoses as the
    gate judged them, every feature's section (speed, invariance, noise, drift) kept as written."""
    from strict_gate.gate.config import load_copied_config
    from strict_gate.gate.judgement import judge_stored, stored_diagnoses
    from strict_gate.gate.rewrite import check_rewritable, rewrite_reports
    from strict_gate.judge.spec import ConfigRef, GateSpec, PromptSetRef
    from strict_gate.judge.stored import load_report
    from strict_gate.runs.layout import ReportDir
    from strict_gate.runs.reader import load_run

    report_dir = Path(report_dir)
    if not (report_dir / "report.json").is_file():
        raise InputError("not a gate report directory (report.json is missing)", path=str(report_dir))
    stored = load_report(report_dir)  # report.json in its declared shape: exit 2 naming the field
    check_rewritable(ReportDir(report_dir), stored)  # before any engine starts
    if not (report_dir / "gate.toml").is_file():
        raise InputError("not a gate report directory (gate.toml is missing)", path=str(report_dir))
    config = stored.config
    base_dir = Path(config.base_dir) if config and config.base_dir else None
    cfg = load_copied_config(report_dir / "gate.toml", started=config.path if config else None, base_dir=base_dir)
    rows = {p.id: p for p in stored.prompts}
    if prompt is not None and prompt not in rows:
        raise InputError(f"prompt {prompt!r} is not in the report", path=str(report_dir / "report.json"))
    if prompt is not None and rows[prompt].first_divergence is None:
        raise InputError(f"prompt {prompt!r} did not diverge (status {str(rows[prompt].status)!r}): "
                         "nothing to localise", path=str(report_dir / "report.json"))
    lc = of(cfg)
    base = lc.settings if lc is not None else Settings()
    settings = Settings(
        points=parse_points(points) if points is not None else base.points,
        positions=positions or base.positions,
        tolerance=check_tolerance(tolerance) if tolerance is not None else base.tolerance,
        graft=graft and base.graft, keep=keep or base.keep, narrow=narrow and base.narrow,
        mode=parse_mode(mode) if mode is not None else base.mode)
    ref = load_run(report_dir / "reference", allow_incomplete=True)
    cand = load_run(report_dir / "candidate", allow_incomplete=True)
    spec = GateSpec(
        name=cfg.name,
        prompt_set=PromptSetRef.stored(msgspec.to_builtins(stored.prompt_set) if stored.prompt_set is not None
                                       else dict(ref.manifest.prompt_set), list(rows) or None),
        sampling=ref.manifest.sampling, policy=stored.policy or cfg.policy,
        band=cfg.band if stored.band is None else stored.band, greedy_tolerance=cfg.greedy_tolerance,
        config=ConfigRef.from_json(msgspec.to_builtins(config), where=str(report_dir / "report.json")) if config else None,
    )
    result = judge_stored(spec, ref, cand, stored_diagnoses(stored),
                          problems=list(stored.problems))  # the verdict the gate wrote, near-ties judged as it judged them
    result = _kept(result, stored)
    scope = Scope.ALL if prompt is not None else (lc.scope if lc is not None else Scope.DIVERGENT)
    if not targets(result.comparison, result.reference_records, n=1, statuses=scope.statuses, only=prompt,
                   later=result.later, cand_records=result.candidate_records):
        raise InputError("nothing divergent to localise in this report", path=str(report_dir / "report.json"))
    if cfg.candidate is None:
        raise InputError("the report's gate.toml has no [candidate]", path=str(report_dir / "gate.toml"))
    candidate = cfg.candidate.build()
    candidate.set_log_path(ReportDir(report_dir).arm("candidate").engine_log)  # beside its run, not a temp file
    _can_dump_or_exit_2(candidate, report_dir / "gate.toml", settings.mode)  # before the reference loads anything
    reference = cfg.reference.build()
    reference.set_log_path(ReportDir(report_dir).arm("reference").engine_log)
    activations, _, why = activation_reference(cfg, reference, report_dir)
    if activations is None:
        raise ConfigError(why or "no activation reference", path=str(report_dir / "gate.toml"))
    if not type(activations).capabilities_at_start:  # else known once started: checked per prompt
        _decodes_or_exit_2(activations, "activation reference", report_dir / "gate.toml", settings.mode)
    result = localize_result(cfg, result, reference, candidate, report_dir, owned={"reference", "candidate"},
                             scope=scope, settings=settings, only=prompt)
    outcome = rewrite_reports(report_dir, result, stored)
    done = {p for p in result.localization if prompt is None or p == prompt}  # this run's, not old errors
    if errors := [f"{pid}: {e}" for pid, loc in result.localization.items() if pid in done for e in failures(loc)]:
        raise EngineError("; ".join(errors))
    return outcome


def _can_dump_or_exit_2(candidate: Engine, config: Path, mode: DumpMode) -> None:
    """An arm that cannot dump is bad input (exit 2), found before anything heavy starts: an engine
    that learns its capabilities at start (a command engine's hello) is started for its hello
    alone and closed again."""
    why = f"the candidate ({candidate.kind}) cannot dump activations"
    if candidate.can_dump and type(candidate).capabilities_at_start:
        try:
            candidate.start()
        finally:
            candidate.close()
    if not candidate.can_dump:
        raise ConfigError(f"{why} (docs/localize.md: \"Adding dump to your engine\")", path=str(config))
    _decodes_or_exit_2(candidate, "candidate", config, mode)


def _decodes_or_exit_2(engine: Engine, role: str, config: Path, mode: DumpMode) -> None:
    """--mode decode or both with an arm that cannot dump along its decode path: exit 2."""
    if mode in (DumpMode.DECODE, DumpMode.BOTH) and not engine.can_dump_decode:
        raise ConfigError(f"--mode {mode}: the {role} ({engine.kind}) cannot dump along its decode path "
                          "(no dump_decode; docs/localize.md, \"The decode path\")", path=str(config))


def failures(loc: Localization) -> list[str]:
    """What failed in a localisation, both paths (`both`) and a refused op graft included."""
    out = [loc.error] if loc.error else []
    if loc.op_graft_refused and loc.op_graft_note:
        out.append(f"grafting at ops {loc.op_graft_note}")
    return out + ([f"decode path: {e}" for e in failures(loc.decode)] if loc.decode is not None else [])


def _kept(result: GateResult, old: ReportDoc) -> GateResult:
    """What the gate wrote beside its feature sections that a localisation does not redo: diagnoses,
    the old localisations (a prompt localised now replaces its own), the trend, notes."""
    from strict_gate.gate.judgement import stored_diagnoses

    try:
        localization = {p.id: restore.localization(p.localization) for p in old.prompts if p.localization}
    except ValueError as e:
        raise InputError(f"the report is malformed ({type(e).__name__}: {e})") from None
    return replace(result, diagnoses=stored_diagnoses(old), history=tuple(old.history), rescored_by=old.rescored_by,
                   localization=localization, notes=tuple(n for n in old.notes if n not in result.verdict.notes))
