"""Teacher-forced re-scoring of a finished gate, from its report directory alone.

A gate run without diagnosis (diagnose = false, a stored reference with no [rescorer],
a failed scorer) can be diagnosed later: the report directory holds the config
(gate.toml), both arms' runs and report.json (read by judge/stored.py), which says the
policy, band and prompt ids the gate judged with, so the new verdict is judged exactly as the
old one was.

Named rescore, not rediagnose, so that `strict_gate.rediagnose` stays the function.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec

from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.config import GateConfig, load_copied_config
from strict_gate.gate.feature import build_rescorer, rejudged
from strict_gate.gate.judgement import cross_judge, judge
from strict_gate.gate.outcome import GateOutcome
from strict_gate.gate.rescorer_identity import refuse_self_rescorer
from strict_gate.gate.rewrite import check_rewritable, rewrite_reports
from strict_gate.judge.result import REPORT_SCHEMA
from strict_gate.judge.schema import ReportDoc
from strict_gate.judge.spec import ConfigRef, GateSpec, PromptSetRef
from strict_gate.judge.stored import load_report
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import EngineInfo


def _old_report(report_dir: Path) -> ReportDoc:
    """The gate's report.json; an empty one when the gate died before writing it."""
    path = report_dir / "report.json"
    return load_report(path) if path.exists() else ReportDoc(schema=REPORT_SCHEMA, prompts=[])


def _scorer(cfg: GateConfig, report_dir: Path, candidate: EngineInfo, reference: EngineInfo) -> tuple[Engine, bool]:
    """The reference engine when it can score, else the [rescorer] arm (built, not started;
    refused when it is the `candidate` that made the run, gate/rescorer_identity.py); and
    whether it is the [rescorer] arm."""
    engine = cfg.reference.build()
    engine.set_log_path(ReportDir(report_dir).arm("reference").engine_log)  # beside its run, not a temp file
    if engine.can_score:
        return engine, False
    engine.close()
    if cfg.rescorer is None:
        raise ConfigError(
            f"the reference engine ({engine.kind}) cannot re-score; add a [rescorer] engine "
            "(hf, vllm, openai or command on the reference's model) to the gate config",
            path=cfg.path,
        )
    rescorer = build_rescorer(cfg, report_dir)
    try:
        refuse_self_rescorer(rescorer.info(), candidate, reference, cfg.path)
    except ConfigError:
        rescorer.close()
        raise
    return rescorer, True


def rediagnose(report_dir: str | Path) -> GateOutcome:
    """Re-score a finished gate's divergent prompts (the reference's side, then the candidate's
    where it can score) and rewrite its reports in place (gate/rewrite.py): the sections that
    hang on the token verdict are judged again (noise), every other one is kept as the gate wrote
    it (speed, invariance, drift, localisation, the trend).

    The scoring engine starts only if something diverged. Raises InputError when the
    directory is not a gate report, ConfigError when no engine can score."""
    report_dir = Path(report_dir)
    cfg_path = report_dir / "gate.toml"
    if not cfg_path.exists():
        raise InputError("not a gate report directory (gate.toml is missing)", path=str(report_dir))
    old = _old_report(report_dir)
    check_rewritable(ReportDir(report_dir), old)  # before any engine starts
    config = msgspec.to_builtins(old.config) if old.config is not None else None
    cfg = load_copied_config(cfg_path, started=config.get("path") if config else None,
                             base_dir=Path(config["base_dir"]) if config and config["base_dir"] else None)
    ref = load_run(report_dir / "reference", allow_incomplete=True)
    cand = load_run(report_dir / "candidate", allow_incomplete=True)
    prompt_set = msgspec.to_builtins(old.prompt_set) if old.prompt_set is not None else dict(ref.manifest.prompt_set)
    engine, rescorer_arm = _scorer(cfg, report_dir, cand.manifest.engine, ref.manifest.engine)
    try:
        spec = GateSpec(
            name=cfg.name,
            prompt_set=PromptSetRef.stored(prompt_set, [p.id for p in old.prompts] or None),
            sampling=ref.manifest.sampling, policy=old.policy or cfg.policy,
            band=cfg.band if old.band is None else old.band, greedy_tolerance=cfg.greedy_tolerance,
            config=ConfigRef.from_json(config, where=str(report_dir / "report.json")) if config else None,
        )
        result = judge(spec, ref, cand, problems=list(old.problems), rescorer=engine)
        if rescorer_arm and result.diagnoses:
            result = replace(result, rescorer=engine.info())
    finally:
        engine.close()
    if cfg.candidate is None:
        raise InputError("the report's gate.toml has no [candidate]", path=str(cfg_path))
    candidate = cfg.candidate.build()  # the candidate's side, once the reference is stopped
    candidate.set_log_path(ReportDir(report_dir).arm("candidate").engine_log)
    try:
        result = cross_judge(spec, ref, cand, result, candidate)
    finally:
        candidate.close()
    result, redone = rejudged(cfg, result)
    return rewrite_reports(report_dir, result, old, redone=redone)
