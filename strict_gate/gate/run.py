"""The gate: tokenize once, run both arms, compare, judge, diagnose, report.

The candidate runs first and is stopped before the reference starts, so a GPU holds one
engine at a time; the reference stays loaded for teacher-forced re-scoring and is loaded
exactly once per gate. `play_gate` reads as the gate's phases, in the order they run.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import redact_toml, scrub_tree
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.engines.recorded import RecordedEngine
from strict_gate.errors import EngineError, GateInterrupted, IncompleteRunError
from strict_gate.gate.arm import finished_run, prompt_inputs, run_arm
from strict_gate.gate.bench import SpeedSession, gate_speed, timed_run
from strict_gate.gate.config import GateConfig
from strict_gate.gate.judgement import compare, cross_judge, gate_spec, judge
from strict_gate.gate.lifetimes import Lifetimes
from strict_gate.gate.noise_band import with_noise
from strict_gate.gate.outcome import ROLES, GateOutcome, ProgressHook, new_report_dir
from strict_gate.gate.rescorer_identity import check_rescorer
from strict_gate.gate.state import GateState, interrupted, record_verdicts, report_lock, verdicts, write_gate_state
from strict_gate.judge.compare import Comparison, Status
from strict_gate.judge.devices import device_notes
from strict_gate.judge.drift import DriftReport, measure_drift
from strict_gate.judge.history import append_history, with_history
from strict_gate.judge.policy import Policy
from strict_gate.judge.spec import GateSpec
from strict_gate.judge.staleness import baseline_staleness
from strict_gate.report import GateResult
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.output import ensure_writable_dir
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Record, Run, write_text_atomic

DIVERGED = (Status.DIVERGENT, Status.NEAR_TIE)  # what teacher-forced diagnosis re-scores


def build_rescorer(cfg: GateConfig, report_dir: Path) -> Engine:
    """The [rescorer] arm (not started); a process it runs logs to <report dir>/rescorer.log,
    which the report names (engines.rescorer), not to a temp file nobody finds."""
    if cfg.rescorer is None:
        raise TypeError("the gate config has no [rescorer] arm")
    engine = cfg.rescorer.build()
    engine.set_log_path(ReportDir(report_dir).rescorer_log)
    return engine


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
        result = play_gate(cfg, spec, ps, inputs, report, state, reference=reference, candidate=candidate,
                           owned=set(ROLES) - set(given), progress=progress)
    return GateOutcome(result, report.path)


@dataclass(frozen=True)
class _Gate:
    """What every phase of one gate reads: its settings, prompts, engines and report directory."""

    cfg: GateConfig
    spec: GateSpec
    ps: PromptSet
    inputs: list[PromptInput]
    report: ReportDir
    state: GateState  # its seal key; the verdicts are added to it when the gate finishes
    progress: ProgressHook | None
    prior: Mapping[str, Run]  # the runs an interrupted gate left, by role
    reference: Engine
    candidate: Engine
    speed: SpeedSession | None  # the [speed] arm
    speed_ref: Engine | None  # the engine it times as the reference: the reference, or the [rescorer]

    def engine(self, role: str) -> Engine:
        return self.reference if role == "reference" else self.candidate

    def done(self, role: str) -> Run | None:
        """The run an interrupted gate had finished for this arm (its engine is not started); one
        with an error reply, or a prompt missing, is continued: those prompts are generated again."""
        run = self.prior.get(role)
        return run if run is not None and finished_run(run, self.ps.ids) else None


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
) -> GateResult:
    """Run both arms into the report directory (candidate first), judge, diagnose and write the reports.

    `prior` holds the runs an interrupted gate left: a complete one is kept as it is (its
    engine is not started), an unfinished one is continued. Engines in `owned` are closed."""
    speed, speed_ref = gate_speed(cfg, inputs, reference, candidate, lambda: build_rescorer(cfg, report.path))
    g = _Gate(cfg, spec, ps, inputs, report, state, progress, prior or {}, reference, candidate, speed, speed_ref)
    try:
        result = _play(g, owned)
    except GateInterrupted:
        raise
    except KeyboardInterrupt:
        raise interrupted(report) from None
    return _write_phase(result, g)


def _play(g: _Gate, owned: set[str]) -> GateResult:
    """The phases up to the verdict, the engines closed on the way out."""
    problems: list[str] = []  # arm failures, in words
    drift_notes: list[str] = []
    spec, reference = g.spec, g.reference
    with Lifetimes(g.report) as engines:
        for role in ("reference", "candidate"):  # closed on the way out in the other order
            if role in owned:
                engines.own(role, g.engine(role))
        cand_run, drift = _candidate_phase(g, engines, problems, drift_notes)
        ref_run = _arm_phase(g, "reference", problems)
        comparison = compare(spec, ref_run, cand_run)  # once: the rescorer is chosen on it too
        rescorer = _rescorer(g, ref_run, comparison)
        extras = [e for e in (rescorer, g.speed_ref) if e is not None and e is not reference]  # the gate built them
        engines.own("reference", *extras)
        result = _rescore_phase(g, ref_run, cand_run, comparison, rescorer, problems)
        result = _speed_phase(g, ref_run, result)
        engines.close(*extras)
        result = _cross_phase(g, engines, ref_run, cand_run, result)
        result = _drift_phase(g, engines, ref_run, result, drift, drift_notes)
        result = _localize_phase(g, result, owned)
    return _invariance_phase(g, result)


def _arm_phase(g: _Gate, role: str, problems: list[str]) -> Run:
    """An arm's run: kept when an interrupted gate had finished it, else run (or continued
    where it stopped). An engine failure keeps the prompts done and becomes a stated problem."""
    done = g.done(role)
    if done is not None:
        return done
    prior = g.prior.get(role)
    out = g.report.arm(role).path
    on_record = None
    if g.progress:
        kept = {r.id for r in prior.records.values() if r.error is None} if prior else set()
        left = sum(1 for p in g.inputs if p.id not in kept)
        on_record = g.progress(f"{role} (resumed, {len(g.inputs) - left} kept)" if prior else role, left)
    try:
        return run_arm(g.engine(role), g.inputs, g.spec.sampling, out, prompt_set=g.ps,
                       runs=g.cfg.reference.runs if role == "reference" else 1, on_record=on_record, resume_from=prior,
                       seal_key=g.state.arm_key(role))
    except (EngineError, IncompleteRunError) as e:
        problems.append(f"{role} engine failed: {e}")
        return load_run(out, allow_incomplete=True)


def _candidate_phase(g: _Gate, engines: Lifetimes, problems: list[str],
                     notes: list[str]) -> tuple[Run, DriftReport | None]:
    """The candidate's run, timed on the engine it just ran on; with a stored reference, whose
    tokens are known, its drift too (no extra load). Then the candidate is stopped."""
    cand_run = _arm_phase(g, "candidate", problems)
    if g.speed is not None:
        timed_run(g.speed, "candidate", g.candidate, cand_run, g.report.arm("candidate").path)
    drift = None
    if g.cfg.drift and g.reference.replays_run:
        assert isinstance(g.reference, RecordedEngine)  # the engine that replays a run
        drift = _drift_pass(g, g.reference.run.records, notes)
    engines.close(g.candidate)
    return cand_run, drift


def _rescorer(g: _Gate, ref_run: Run, comparison: Comparison) -> Engine | None:
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
    built = g.speed_ref if g.speed_ref is not g.reference else None  # the speed arm's stand-in: one load for both
    return built or build_rescorer(g.cfg, g.report.path)


def _rescore_phase(g: _Gate, ref_run: Run, cand_run: Run, comparison: Comparison, rescorer: Engine | None,
                   problems: list[str]) -> GateResult:
    """The verdict, with the divergences re-scored by `rescorer`; a gate that wanted diagnosis
    and had no engine for it says so."""
    result = judge(g.spec, ref_run, cand_run, problems=problems, rescorer=rescorer, comparison=comparison)
    if rescorer is not None and rescorer is not g.reference and result.diagnoses:
        result = replace(result, rescorer=rescorer.info())
    scored = rescorer is not None and rescorer.can_score
    if g.cfg.diagnose and not scored and any(p.status in DIVERGED for p in comparison.prompts):
        result = replace(result, notes=(*result.notes, (
            "teacher-forced diagnosis skipped: the reference cannot re-score (a stored run or a failed arm); "
            "add a [rescorer] engine to the gate config, or run `strict-gate diagnose REPORT_DIR`")))
    return result


def _cross_phase(g: _Gate, engines: Lifetimes, ref_run: Run, cand_run: Run, result: GateResult) -> GateResult:
    """The candidate's side of each divergence: the candidate, restarted once the reference is
    stopped (one engine at a time), scores the reference's tokens up to the divergence, and
    each diverged prompt is classified once from both sides. A candidate that cannot score
    leaves its gap unknown, said in the reason, and the prompt divergent."""
    if not g.cfg.diagnose or not any(p.status in DIVERGED for p in result.comparison.prompts):
        return result
    if g.candidate.can_score:
        engines.close(g.reference)
        engines.reopen(g.candidate)
    result = cross_judge(g.spec, ref_run, cand_run, result, g.candidate)
    if not (g.cfg.drift and not g.reference.replays_run):  # else the drift pass scores on it next
        engines.close(g.candidate)
    return result


def _speed_phase(g: _Gate, ref_run: Run, result: GateResult) -> GateResult:
    """The [speed] arm's reference side, timed on the engine still loaded, and its verdict."""
    if g.speed is None or g.speed_ref is None:
        return result
    timed_run(g.speed, "reference", g.speed_ref, ref_run if g.speed_ref is g.reference else None,
              g.report.arm("reference").path)
    return replace(result, speed=g.speed.result())


def _drift_phase(g: _Gate, engines: Lifetimes, ref_run: Run, result: GateResult, drift: DriftReport | None,
                 notes: list[str]) -> GateResult:
    """With a live reference: stop it and restart the candidate to score the reference's tokens
    (one engine at a time). The drift, measured here or in the candidate phase, joins the result."""
    if g.cfg.drift and not g.reference.replays_run:
        engines.close(g.reference)
        engines.reopen(g.candidate)
        drift = _drift_pass(g, ref_run.records, notes)
        engines.close(g.candidate)
    if drift is not None:
        drift = drift.with_divergences(
            {p.id: p.first_divergence.position for p in result.comparison.prompts if p.first_divergence}
        )
    return replace(result, drift=drift, notes=result.notes + tuple(notes))


def _drift_pass(g: _Gate, ref_records: Mapping[str, Record], notes: list[str]) -> DriftReport | None:
    """Teacher-force every reference token sequence through the candidate (gate option `drift`).
    A candidate that cannot score, or fails to start, gives no drift, stated in a note (drift
    informs; it never changes the verdict)."""
    candidate = g.candidate
    if not candidate.can_score:
        notes.append(f"drift not measured: the candidate engine ({candidate.kind}) cannot score")
        return None
    on_record = g.progress("drift (candidate scores the reference)", len(g.ps.ids)) if g.progress else None
    k = g.spec.sampling.top_logprobs

    def score(ref):
        t0 = time.perf_counter()
        try:
            return candidate.score(ref.prompt_token_ids, ref.token_ids, k)
        finally:
            if on_record is not None:
                on_record(ref, time.perf_counter() - t0)

    with candidate.scoped_env():
        t0 = time.perf_counter()
        try:
            candidate.start()
        except Exception as e:
            notes.append(f"drift not measured: the candidate engine did not start: {type(e).__name__}: {e}")
            return None
        t1 = time.perf_counter()
        drift = measure_drift(ref_records, g.ps.ids, score, k=k, band=g.spec.band,
                              scored_by=f"{candidate.kind} {candidate.info().model}")
    return replace(drift, seconds={"start": t1 - t0, "score": time.perf_counter() - t1})


def _localize_phase(g: _Gate, result: GateResult, owned: set[str]) -> GateResult:
    """With `localize`: each divergent prompt localised along the depth (docs/localize.md), after
    diagnosis and drift; it restarts the engines it needs, one at a time."""
    if g.cfg.localize is None:
        return result
    from strict_gate.gate.localize import localize_result

    return localize_result(g.cfg, result, g.reference, g.candidate, g.report.path, owned=owned,
                           scope=g.cfg.localize.scope, settings=g.cfg.localize.settings)


def _invariance_phase(g: _Gate, result: GateResult) -> GateResult:
    """With `[invariance]`: each named arm's batch-1 run and its variants, last, when every
    engine of the gate is stopped; their engine logs are scrubbed like the arms'."""
    if g.cfg.invariance is None:
        return result
    from strict_gate.gate.invariance import invariance_phase

    try:
        return replace(result, invariance=invariance_phase(g.cfg, g.ps, g.inputs, g.report.path, g.progress))
    finally:
        scrub_tree(g.report.path)


def _write_phase(result: GateResult, g: _Gate) -> GateResult:
    """The baseline's staleness and the trend join the result; the verdicts are sealed into the
    gate state, the reports are written (report.json last), and tonight is appended to the
    output directory's history."""
    from strict_gate.report import write_reports

    report = g.report
    result = with_noise(result, g.cfg.noise)
    devices = device_notes(result.reference, result.candidate, result.rescorer, result.comparison)
    result, night = with_history(replace(result, notes=result.notes + baseline_staleness(result.reference) + devices),
                                 report.path)
    record_verdicts(report, g.state, verdicts(result), result.exit_code)
    write_reports(result, report.path)
    append_history(report.path.parent, night)
    return result
