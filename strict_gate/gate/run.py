"""The gate: tokenize once, run both arms, compare, judge, diagnose, report.

The candidate runs first and is stopped before the reference starts, so a GPU holds one
engine at a time; the reference stays loaded for teacher-forced re-scoring and is loaded
exactly once per gate. `play_gate` reads as the gate's own phases, in the order they run,
with the enabled features (gate/feature.py: speed, drift, localize, invariance, noise)
called at its named points.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import redact_toml
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import EngineError, GateInterrupted, IncompleteRunError
from strict_gate.gate.arm import prompt_inputs, run_arm
from strict_gate.gate.config import GateConfig
from strict_gate.gate.feature import Feature, Gate, enabled
from strict_gate.gate.interrupt import interrupted
from strict_gate.gate.judgement import compare, cross_judge, gate_spec, judge
from strict_gate.gate.kept import Planned
from strict_gate.gate.lifetimes import Lifetimes
from strict_gate.gate.outcome import ROLES, GateOutcome, ProgressHook, new_report_dir
from strict_gate.gate.rescorer_identity import check_rescorer
from strict_gate.gate.state import GateState, record_verdicts, report_lock, verdicts, write_gate_state
from strict_gate.judge.compare import Comparison, Status
from strict_gate.judge.devices import device_notes
from strict_gate.judge.history import append_history, with_history
from strict_gate.judge.policy import Policy
from strict_gate.judge.spec import GateSpec
from strict_gate.judge.staleness import baseline_staleness
from strict_gate.report import GateResult
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.output import ensure_writable_dir
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, write_text_atomic

DIVERGED = (Status.DIVERGENT, Status.NEAR_TIE)  # what teacher-forced diagnosis re-scores


def run_gate(
    cfg: GateConfig,
    *,
    policy: Policy | str | None = None,
    band: float | None = None,
    output_dir: Path | None = None,
    progress: ProgressHook | None = None,
    engines: dict[str, Engine] | None = None,
) -> GateOutcome:
    """Run a gate. `engines` may hand in already-started engines by role ("reference",
    "candidate"); the caller owns those and the gate does not close them."""
    ps = load_prompts(cfg.prompts)
    spec = gate_spec(cfg, ps, policy=policy, band=band)
    ensure_writable_dir(output_dir or cfg.output_dir)
    given = engines or {}
    reference = given.get("reference") or cfg.reference.build()
    candidate = given.get("candidate")
    if candidate is None:
        assert cfg.candidate is not None  # load_gate_config requires one for a gate
        candidate = cfg.candidate.build()
    check_rescorer(cfg.rescorer, candidate, reference, cfg.path)
    for role, engine in (("reference", reference), ("candidate", candidate)):
        engine.check_prompt_set(ps, role)  # e.g. a text-only arm and a set of token ids
    reference.check_compatible(ps.sha256, spec.sampling)
    report = ReportDir(new_report_dir(output_dir or cfg.output_dir, cfg.name))
    with report_lock(report):
        try:  # the reference's tokenizer may log on loading: into its run directory's engine.log
            with engine_log(report.arm("reference").engine_log, reference.log_libraries):
                inputs = prompt_inputs(ps, reference)
        except BaseException:
            shutil.rmtree(report.path, ignore_errors=True)  # bad input: no half-made report directory
            raise
        write_text_atomic(report.gate_toml, redact_toml(Path(cfg.path).read_text(encoding="utf-8")))
        state = write_gate_state(report, cfg, ps, spec)  # what `gate --resume` needs
        return play_gate(cfg, spec, ps, inputs, report, state, reference=reference, candidate=candidate,
                         owned=set(ROLES) - set(given), progress=progress)


def play_gate(
    cfg: GateConfig,
    spec: GateSpec,
    ps: PromptSet,
    inputs: list[PromptInput],
    report: ReportDir,
    state: GateState,
    *,
    reference: Engine,
    candidate: Engine,
    owned: set[str],
    progress: ProgressHook | None,
    prior: Mapping[str, Run] | None = None,
) -> GateOutcome:
    """Run both arms into the report directory (candidate first), judge, diagnose and write the reports.

    `prior` holds the runs an interrupted gate left: a complete one is kept as it is (its
    engine is not started), an unfinished one is continued. Engines in `owned` are closed."""
    g = Gate(cfg, spec, ps, inputs, report, state, progress, prior or {}, reference, candidate, frozenset(owned))
    features = enabled(g)
    try:
        result = _play(g, features)
        for f in features:
            g.where.phase = f.name
            result = f.last(result)
    except GateInterrupted:
        raise
    except KeyboardInterrupt:
        arms = tuple(Planned(f"{role} arm", "", report.arm(role).path) for role in ROLES)
        raise interrupted(g.runs(), arms + tuple(p for f in features for p in f.planned())) from None
    return _write_phase(result, g, features)


def _play(g: Gate, features: tuple[Feature, ...]) -> GateResult:
    """The phases up to the verdict and its diagnosis, the engines closed on the way out."""
    problems: list[str] = []  # arm failures, in words
    spec, reference = g.spec, g.reference
    with Lifetimes(g.report) as engines:
        for role in ("reference", "candidate"):  # closed on the way out in the other order
            if role in g.owned:
                engines.own(role, g.engine(role))
        cand_run = _arm_phase(g, "candidate", problems)
        for f in features:
            g.where.phase = f.name
            f.after_candidate(engines, cand_run)
        engines.close(g.candidate)
        ref_run = _arm_phase(g, "reference", problems)
        g.where.phase = "verdict"
        comparison = compare(spec, ref_run, cand_run)  # once: the rescorer is chosen on it too
        rescorer = _rescorer(g, ref_run, comparison)
        extras = [e for e in (rescorer, *g.built.values()) if e is not None and e is not reference]  # the gate built them
        engines.own("reference", *extras)
        result = _rescore_phase(g, ref_run, cand_run, comparison, rescorer, problems)
        for f in features:
            g.where.phase = f.name
            result = f.after_verdict(ref_run, result)
        engines.close(*extras)
        g.where.phase = "cross-scoring"
        result = _cross_phase(g, engines, ref_run, cand_run, result)
        for f in features:
            g.where.phase = f.name
            result = f.after_cross(engines, ref_run, result)
        engines.close(g.candidate)
        for f in features:
            g.where.phase = f.name
            result = f.after_diagnosis(result)
    return result


def _arm_phase(g: Gate, role: str, problems: list[str]) -> Run:
    """An arm's run: kept when an interrupted gate had finished it, else run (or continued
    where it stopped). An engine failure keeps the prompts done and becomes a stated problem."""
    g.where.phase = f"{role} arm"
    done = g.done(role)
    if done is not None:
        return done
    prior = g.prior.get(role)
    out = g.report.arm(role).path
    g.where.run = out  # an interrupt leaves it naming this run
    on_record = None
    if g.progress:
        kept = {r.id for r in prior.records.values() if r.error is None} if prior else set()
        left = sum(1 for p in g.inputs if p.id not in kept)
        on_record = g.progress(f"{role} (resumed, {len(g.inputs) - left} kept)" if prior else role, left)
    try:
        run = run_arm(g.engine(role), g.inputs, g.spec.sampling, out, prompt_set=g.ps,
                      runs=g.cfg.reference.runs if role == "reference" else 1, on_record=on_record, resume_from=prior,
                      seal_key=g.state.arm_key(role))
    except (EngineError, IncompleteRunError) as e:
        problems.append(f"{role} engine failed: {e}")
        run = load_run(out, allow_incomplete=True)
    g.where.run, g.where.last = None, out
    return run


def _rescorer(g: Gate, ref_run: Run, comparison: Comparison) -> Engine | None:
    """The engine that re-scores divergences: the live reference, else the [rescorer] arm.
    One not already loaded (a baseline's rescorer, the reference of a resumed gate whose
    reference arm had finished) is used only when something diverged."""
    if not g.cfg.diagnose or not ref_run.complete:
        return None
    reference_live = g.done("reference") is None
    if g.reference.can_score and reference_live:
        return g.reference
    if not any(comparison.summary.counts.get(s) for s in DIVERGED):
        return None
    if g.reference.can_score:
        return g.reference
    if g.cfg.rescorer is None:
        return None
    return g.rescorer()  # the speed arm's stand-in, when it built one: one load for both


def _rescore_phase(g: Gate, ref_run: Run, cand_run: Run, comparison: Comparison, rescorer: Engine | None,
                   problems: list[str]) -> GateResult:
    """The verdict, with the divergences re-scored by `rescorer` (proved to be the recorded
    reference first, unless it is the live reference that recorded the whole run); a gate that
    wanted diagnosis and had no engine for it says so."""
    recorded = rescorer is g.reference and g.prior.get("reference") is None  # it made every record, now
    result = judge(g.spec, ref_run, cand_run, problems=problems, rescorer=rescorer, comparison=comparison,
                   recorded_by_rescorer=recorded)
    if rescorer is not None and rescorer is not g.reference and result.diagnoses:
        result = replace(result, rescorer=rescorer.info())
    scored = rescorer is not None and rescorer.can_score
    if g.cfg.diagnose and not scored and any(p.status in DIVERGED for p in comparison.prompts):
        result = replace(result, notes=(*result.notes, (
            "teacher-forced diagnosis skipped: the reference cannot re-score (a stored run or a failed arm); "
            "add a [rescorer] engine to the gate config, or run `strict-gate diagnose REPORT_DIR`")))
    return result


def _cross_phase(g: Gate, engines: Lifetimes, ref_run: Run, cand_run: Run, result: GateResult) -> GateResult:
    """The candidate's side of each divergence: the candidate, restarted once the reference is
    stopped (one engine at a time), scores the reference's tokens up to the divergence, and
    each diverged prompt is classified once from both sides. A candidate that cannot score
    leaves its gap unknown, said in the reason, and the prompt divergent."""
    if not g.cfg.diagnose or not any(p.status in DIVERGED for p in result.comparison.prompts):
        return result
    if g.candidate.can_score:
        engines.close(g.reference)
        engines.reopen(g.candidate)
    return cross_judge(g.spec, ref_run, cand_run, result, g.candidate)


def _write_phase(result: GateResult, g: Gate, features: tuple[Feature, ...]) -> GateOutcome:
    """The baseline's staleness and the trend join the result; the verdicts are sealed into the
    gate state, the reports are written (report.json last), and tonight is appended to the
    output directory's history. The reports' decoder goes out with the result, for the summary
    and console table to reuse."""
    from strict_gate.report import write_reports
    from strict_gate.report.text import gate_decoder

    report = g.report
    for f in features:
        result = f.before_write(result)
    devices = device_notes(result.reference, result.candidate, result.rescorer, result.comparison)
    result, night = with_history(replace(result, notes=result.notes + baseline_staleness(result.reference) + devices),
                                 report.path)
    record_verdicts(report, g.state, verdicts(result), result.exit_code)
    dec = gate_decoder(result)
    write_reports(result, report.path, dec=dec)
    append_history(report.path.parent, night)
    return GateOutcome(result, report.path, dec)
