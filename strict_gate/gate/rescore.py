"""Teacher-forced re-scoring of a finished gate, from its report directory alone.

A gate run without diagnosis (diagnose = false, a stored reference with no [rescorer],
a failed scorer) can be diagnosed later: the report directory holds the config
(gate.toml), both arms' runs and report.json, which says the policy, band and prompt
ids the gate judged with, so the new verdict is judged exactly as the old one was.

Named rescore, not rediagnose, so that `strict_gate.rediagnose` stays the function.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.config import GateConfig, load_gate_config
from strict_gate.gate.judgement import judge
from strict_gate.gate.run import GateOutcome, build_rescorer
from strict_gate.judge.drift import DriftReport
from strict_gate.judge.spec import ConfigRef, GateSpec, PromptSetRef
from strict_gate.report import write_reports
from strict_gate.runs.reader import load_run


def _old_report(report_dir: Path) -> dict:
    """The gate's report.json, or {} when the gate died before writing it."""
    path = report_dir / "report.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read the report: {e}", path=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("not a strict-gate report (expected a JSON object)", path=str(path))
    return data


def _scorer(cfg: GateConfig, report_dir: Path) -> tuple[Engine, bool]:
    """The reference engine when it can score, else the [rescorer] arm (built, not started);
    and whether it is the [rescorer] arm."""
    engine = cfg.reference.build()
    if engine.can_score:
        return engine, False
    engine.close()
    if cfg.rescorer is None:
        raise ConfigError(
            f"the reference engine ({engine.kind}) cannot re-score; add a [rescorer] engine "
            "(hf, vllm, openai or command on the reference's model) to the gate config",
            path=cfg.path,
        )
    return build_rescorer(cfg, report_dir), True


def rediagnose(report_dir: str | Path) -> GateOutcome:
    """Re-score a finished gate's divergent prompts and rewrite its reports in place.

    The scoring engine starts only if something diverged. Raises InputError when the
    directory is not a gate report, ConfigError when no engine can score."""
    report_dir = Path(report_dir)
    cfg_path = report_dir / "gate.toml"
    if not cfg_path.exists():
        raise InputError("not a gate report directory (gate.toml is missing)", path=str(report_dir))
    old = _old_report(report_dir)
    config = old.get("config") or None
    base_dir = Path(config["base_dir"]) if config and config.get("base_dir") else None
    cfg = load_gate_config(cfg_path, base_dir=base_dir)
    ref = load_run(report_dir / "reference", allow_incomplete=True)
    cand = load_run(report_dir / "candidate", allow_incomplete=True)
    engine, rescorer_arm = _scorer(cfg, report_dir)
    try:
        spec = GateSpec(
            name=cfg.name,
            prompt_set=PromptSetRef.stored(old.get("prompt_set") or ref.manifest.prompt_set,
                                           [p["id"] for p in old.get("prompts", [])] or None),
            sampling=ref.manifest.sampling, policy=old.get("policy", cfg.policy), band=old.get("band", cfg.band),
            greedy_tolerance=cfg.greedy_tolerance,
            config=ConfigRef.from_json(config, where=str(report_dir / "report.json")) if config else None,
        )
        result = judge(spec, ref, cand, problems=list(old.get("problems", [])), rescorer=engine)
        if rescorer_arm and result.diagnoses:
            result = replace(result, rescorer=engine.info())
    finally:
        engine.close()
    result = replace(result, history=tuple(old.get("history") or ()))  # the trend as the gate wrote it
    if old.get("drift"):  # the gate's drift pass is not re-run: its figures are kept as they were
        try:
            result = replace(result, drift=DriftReport.from_json(old["drift"]))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise InputError(f"the report's drift object is malformed ({type(e).__name__}: {e})",
                             path=str(report_dir / "report.json")) from None
    write_reports(result, report_dir)
    return GateOutcome(result, report_dir)
