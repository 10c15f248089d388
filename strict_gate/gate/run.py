"""The gate: tokenize once, run both arms, compare, judge, diagnose, report.

The candidate runs first and is stopped before the reference starts, so a GPU holds one
engine at a time; the reference stays loaded for teacher-forced re-scoring and is loaded
exactly once per gate.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import redact_toml, scrub_tree
from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError, EngineError, IncompleteRunError, InputError
from strict_gate.gate.arm import OnRecord, determinism_summary, prompt_inputs, run_arm
from strict_gate.gate.bench import gate_speed, timed_run
from strict_gate.gate.config import GateConfig
from strict_gate.gate.state import write_gate_state
from strict_gate.judge.compare import DEFAULT_BAND, check_band, compare_runs
from strict_gate.judge.diagnose import DIAGNOSED, diagnose
from strict_gate.judge.drift import DriftReport, measure_drift
from strict_gate.judge.history import append_history, with_history
from strict_gate.judge.policy import Policy, apply_policy, check_policy
from strict_gate.judge.staleness import baseline_staleness
from strict_gate.report import GateResult
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE, check_comparable
from strict_gate.runs.output import ensure_writable_dir, inside, safe_name, staged_run_dir
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, Sampling, now_iso, write_text_atomic

ProgressHook = Callable[[str, int], OnRecord]  # (arm label, prompt count) -> per-record callback
RESCORER_LOG = "rescorer.log"
ROLES = ("candidate", "reference")  # in the order they run: one engine loaded at a time


@dataclass(frozen=True)
class GateOutcome:
    result: GateResult
    report_dir: Path


def new_report_dir(output_dir: Path, name: str) -> Path:
    """A fresh directory for one gate's reports, named after the gate, always inside output_dir."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = output_dir / f"{safe_name(name)}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return inside(path, output_dir)


def valid_band(band: float) -> float:
    """A band given on the command line or by a caller: finite and >= 0, else bad input."""
    try:
        return check_band(band)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _arm(engine: Engine, label: str, inputs, sampling, out: Path, ps: PromptSet, runs: int,
         progress: ProgressHook | None, problems: list[str], prior: Run | None = None) -> Run:
    """Run an arm (or what an interrupted one left); an engine failure keeps the prompts done
    and becomes a stated problem."""
    on_record = None
    if progress:
        done = {r.id for r in prior.records.values() if r.error is None} if prior else set()
        left = sum(1 for p in inputs if p.id not in done)
        on_record = progress(f"{label} (resumed, {len(inputs) - left} kept)" if prior else label, left)
    try:
        return run_arm(engine, inputs, sampling, out, prompt_set=ps, runs=runs, on_record=on_record,
                       resume_from=prior)
    except (EngineError, IncompleteRunError) as e:
        problems.append(f"{label} engine failed: {e}")
        return load_run(out, allow_incomplete=True)


def judge(
    name: str,
    ps_info: dict,
    sampling: Sampling,
    ref: Run,
    cand: Run,
    *,
    prompt_ids: list[str] | None,
    policy: Policy | str,
    band: float,
    problems: list[str],
    rescorer: Engine | None = None,
    config: dict | None = None,
    diagnose_wanted: bool = False,
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE,
) -> GateResult:
    """Compare two runs, apply the policy, and (given a scoring engine) diagnose divergences."""
    policy = check_policy(policy)
    band = valid_band(band)
    for label, run in (("reference", ref), ("candidate", cand)):
        if not run.complete and not any(p.startswith(label) for p in problems):
            problems.append(f"{label} run is {run.manifest.status}: {run.manifest.error or 'not finished'}")
    comparison = compare_runs(
        ref.records, cand.records, band=band, prompt_ids=prompt_ids, greedy_tolerance=greedy_tolerance
    )
    verdict = apply_policy(comparison, policy, ref.records, cand.records, run_problems=tuple(problems))
    diagnoses = {}
    notes: list[str] = []
    rescored_by = None
    if rescorer is not None and rescorer.can_score:
        with engine_log(Path(ref.path) / "engine.log", rescorer.log_libraries):  # a rescorer's start-up too
            diagnoses = diagnose(comparison, ref.records, cand.records, rescorer, sampling.top_logprobs)
        rescored_by = f"{rescorer.kind} {rescorer.info().model}" if diagnoses else None
    elif diagnose_wanted and any(p.status in DIAGNOSED for p in comparison.prompts):
        notes.append(
            "teacher-forced diagnosis skipped: the reference cannot re-score (a stored run or a failed arm); "
            "add a [rescorer] engine to the gate config, or run `strict-gate diagnose REPORT_DIR`"
        )
    sampled = [r for r in ref.records.values() if r.samples]
    resumed = {label: list(run.manifest.resumed) for label, run in (("reference", ref), ("candidate", cand))}
    return GateResult(
        name=name,
        created=now_iso(),
        verdict=verdict,
        comparison=comparison,
        reference=ref.manifest.engine,
        candidate=cand.manifest.engine,
        prompt_set=ps_info,
        sampling=sampling,
        reference_records=ref.records,
        candidate_records=cand.records,
        diagnoses=diagnoses,
        runs={"reference": ref.path, "candidate": cand.path},
        determinism=determinism_summary(list(ref.records.values())) if sampled else None,
        problems=tuple(problems),
        config=config,
        notes=tuple(notes),
        rescored_by=rescored_by,
        resumed={label: entries for label, entries in resumed.items() if entries},
    )


def compare_run_dirs(
    reference: str | Path,
    candidate: str | Path,
    *,
    policy: Policy | str = Policy.AUTO,
    band: float = DEFAULT_BAND,
    prompts: str | Path | None = None,
    out: str | Path | None = None,
) -> GateResult:
    """Compare two stored run directories (no engine, no torch) and optionally write reports.

    Runs that are not comparable (prompt set, max_tokens, top_logprobs) are bad input (exit 2);
    `prompts` names the prompt set whose ids are expected, so a prompt missing from both runs
    is reported as missing rather than silently absent."""
    ref_dir, cand_dir = Path(reference), Path(candidate)
    band = valid_band(band)
    ref = load_run(ref_dir, allow_incomplete=True)
    cand = load_run(cand_dir, allow_incomplete=True)
    check_comparable(ref, cand)
    ps_info = dict(ref.manifest.prompt_set)
    prompt_ids = ref.manifest.prompt_ids or cand.manifest.prompt_ids
    if prompts is not None:
        ps = load_prompts(prompts)
        if ps.sha256 != ps_info.get("sha256"):
            raise InputError(
                f"prompt set sha256 {ps.sha256} differs from the runs' {ps_info.get('sha256')}",
                path=str(prompts),
            )
        prompt_ids = ps.ids
    result = judge(
        f"{ref_dir.name}-vs-{cand_dir.name}", ps_info, ref.manifest.sampling, ref, cand,
        prompt_ids=prompt_ids, policy=policy, band=band, problems=[],
    )
    if out is not None:
        from strict_gate.report import write_reports

        write_reports(result, Path(out))
    return result


def _rescorer(cfg: GateConfig, reference: Engine, ref_run: Run, cand_run: Run, band: float, report_dir: Path,
              *, reference_live: bool = True, built: Engine | None = None) -> Engine | None:
    """The engine that re-scores divergences: the live reference, else the [rescorer] arm.
    One not already loaded (a baseline's rescorer, the reference of a resumed gate whose
    reference arm had finished) is used only when something diverged."""
    if not ref_run.complete:
        return None
    if reference.can_score and reference_live:
        return reference
    diverged = compare_runs(
        ref_run.records, cand_run.records, band=band, greedy_tolerance=cfg.greedy_tolerance
    ).summary.counts
    if not any(diverged.get(s) for s in DIAGNOSED):
        return None
    if reference.can_score:
        return reference
    if cfg.rescorer is None:
        return None
    return built or build_rescorer(cfg, report_dir)  # built: the speed arm's stand-in, one load for both


def build_rescorer(cfg: GateConfig, report_dir: Path) -> Engine:
    """The [rescorer] arm (not started); a process it runs logs to <report dir>/rescorer.log,
    which the report names (engines.rescorer), not to a temp file nobody finds."""
    engine = cfg.rescorer.build()
    engine.set_log_path(report_dir / RESCORER_LOG)
    return engine


def capture_baseline(
    cfg: GateConfig,
    out: Path,
    *,
    runs: int,
    progress: ProgressHook | None = None,
    engine: Engine | None = None,
    force: bool = False,
) -> Run:
    """Run the reference K times per prompt (one prompt per call) into a baseline run with
    its determinism summary. A given `engine` is used as is and left open. `out` is replaced
    only by a finished capture, and a complete one there only with `force`."""
    ps = load_prompts(cfg.prompts)
    with staged_run_dir(out, force=force) as staged:
        reference = engine or cfg.reference.build()
        try:
            inputs = prompt_inputs(ps, reference)
            run_arm(
                reference, inputs, Sampling(cfg.max_tokens, cfg.top_logprobs), staged, prompt_set=ps, runs=runs,
                on_record=progress(f"capture x{runs}", len(inputs)) if progress else None,
            )
        finally:
            if engine is None:
                reference.close()
    return load_run(out)


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
    sampling = Sampling(cfg.max_tokens, cfg.top_logprobs)
    policy = check_policy(policy or cfg.policy)
    band = cfg.band if band is None else valid_band(band)
    ensure_writable_dir(output_dir or cfg.output_dir)
    given = engines or {}
    reference = given.get("reference") or cfg.reference.build()
    candidate = given.get("candidate") or cfg.candidate.build()
    reference.check_compatible(ps.sha256, sampling)
    report_dir = new_report_dir(output_dir or cfg.output_dir, cfg.name)
    try:  # the reference's tokenizer may log on loading: into its run directory's engine.log
        with engine_log(report_dir / "reference" / "engine.log", reference.log_libraries):
            inputs = prompt_inputs(ps, reference)
    except BaseException:
        shutil.rmtree(report_dir, ignore_errors=True)  # bad input: no half-made report directory
        raise
    write_text_atomic(report_dir / "gate.toml", redact_toml(Path(cfg.path).read_text(encoding="utf-8")))
    write_gate_state(report_dir, cfg, ps, policy=policy, band=band)  # what `gate --resume` needs
    result = play_gate(
        cfg, ps, inputs, report_dir, reference=reference, candidate=candidate, owned=set(ROLES) - set(given),
        policy=policy, band=band, progress=progress,
        config={"path": str(Path(cfg.path).resolve()), "base_dir": str(cfg.reference.base_dir)},
    )
    return GateOutcome(result, report_dir)


def _drift_pass(candidate: Engine, ref_records: dict, cfg: GateConfig, ps: PromptSet, band: float,
                progress: ProgressHook | None, notes: list[str]) -> DriftReport | None:
    """Teacher-force every reference token sequence through the candidate (gate option `drift`).
    A candidate that cannot score, or fails to start, gives no drift, stated in a note (drift
    informs; it never changes the verdict)."""
    if not candidate.can_score:
        notes.append(f"drift not measured: the candidate engine ({candidate.kind}) cannot score")
        return None
    on_record = progress("drift (candidate scores the reference)", len(ps.ids)) if progress else None
    k = cfg.top_logprobs

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
        drift = measure_drift(ref_records, ps.ids, score, k=k, band=band,
                              scored_by=f"{candidate.kind} {candidate.info().model}")
    return replace(drift, seconds={"start": t1 - t0, "score": time.perf_counter() - t1})


def _close(engine: Engine, run_dir: Path) -> None:
    """Stop an engine; what it logs on the way out (vLLM's shutdown) goes to its engine.log."""
    with engine_log(run_dir / "engine.log", engine.log_libraries):
        engine.close()


def play_gate(
    cfg: GateConfig,
    ps: PromptSet,
    inputs,
    report_dir: Path,
    *,
    reference: Engine,
    candidate: Engine,
    owned: set[str],
    policy: Policy,
    band: float,
    progress: ProgressHook | None,
    config: dict,
    prior: dict[str, Run] | None = None,
) -> GateResult:
    """Run both arms into report_dir (candidate first), judge, diagnose and write the reports.

    `prior` holds the runs an interrupted gate left: a complete one is kept as it is (its
    engine is not started), an unfinished one is continued. Engines in `owned` are closed."""
    prior = prior or {}
    sampling = Sampling(cfg.max_tokens, cfg.top_logprobs)
    problems: list[str] = []
    done = {role: run for role, run in prior.items() if run.complete}
    drift, drift_notes = None, []
    speed, speed_ref = gate_speed(cfg, inputs, reference, candidate, lambda: build_rescorer(cfg, report_dir))
    try:
        try:
            cand_run = done.get("candidate") or _arm(
                candidate, "candidate", inputs, sampling, report_dir / "candidate", ps, 1, progress, problems,
                prior.get("candidate"),
            )
            if speed is not None:  # timed on the engine the arm just ran, before it is stopped
                timed_run(speed, "candidate", candidate, cand_run, report_dir / "candidate")
            if cfg.drift and reference.replays_run:  # the baseline's tokens are known: no extra load
                drift = _drift_pass(candidate, reference.run.records, cfg, ps, band, progress, drift_notes)
        finally:
            if "candidate" in owned:
                _close(candidate, report_dir / "candidate")
        ref_run = done.get("reference") or _arm(
            reference, "reference", inputs, sampling, report_dir / "reference", ps, cfg.reference.runs,
            progress, problems, prior.get("reference"),
        )
        ps_info = {"name": ps.name, "sha256": ps.sha256, "count": len(ps), "path": str(cfg.prompts)}
        rescorer = (
            _rescorer(cfg, reference, ref_run, cand_run, band, report_dir, reference_live="reference" not in done,
                      built=speed_ref if speed_ref is not reference else None)
            if cfg.diagnose else None
        )
        try:
            result = judge(
                cfg.name, ps_info, sampling, ref_run, cand_run,
                prompt_ids=ps.ids, policy=policy, band=band, problems=problems, rescorer=rescorer,
                diagnose_wanted=cfg.diagnose, greedy_tolerance=cfg.greedy_tolerance, config=config,
            )
            if rescorer is not None and rescorer is not reference and result.diagnoses:
                result = replace(result, rescorer=rescorer.info())
            if speed is not None:
                timed_run(speed, "reference", speed_ref, ref_run if speed_ref is reference else None,
                          report_dir / "reference")
                result = replace(result, speed=speed.result())
        finally:
            for extra in {id(e): e for e in (rescorer, speed_ref) if e is not None and e is not reference}.values():
                _close(extra, report_dir / "reference")
        if cfg.drift and not reference.replays_run:
            if "reference" in owned:
                _close(reference, report_dir / "reference")  # one engine at a time: the candidate restarts
            try:
                drift = _drift_pass(candidate, ref_run.records, cfg, ps, band, progress, drift_notes)
            finally:
                if "candidate" in owned:
                    _close(candidate, report_dir / "candidate")
        if drift is not None:
            drift = drift.with_divergences(
                {p.id: p.first_divergence.position for p in result.comparison.prompts if p.first_divergence}
            )
        result = replace(result, drift=drift, notes=result.notes + tuple(drift_notes))
    finally:
        if "reference" in owned:
            _close(reference, report_dir / "reference")
        scrub_tree(report_dir)  # engine logs too, even when interrupted: a server may log its key
    if cfg.invariance is not None:  # last: every engine of the gate is stopped by now
        from strict_gate.gate.invariance import invariance_phase

        result = replace(result, invariance=invariance_phase(cfg, ps, inputs, report_dir, progress))
    from strict_gate.report import write_reports

    result, night = with_history(replace(result, notes=result.notes + baseline_staleness(result.reference)), report_dir)
    write_reports(result, report_dir)
    append_history(report_dir.parent, night)
    return result
