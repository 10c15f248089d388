"""judge(): two runs and the GateSpec they are judged by, to one GateResult.

The gate, a resumed gate, `compare` and `strict-gate diagnose` all judge through here; the
gate builds its spec once (gate_spec) from the config and the command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.engines.base import Engine
from strict_gate.engines.eos import run_stop_ids
from strict_gate.gate.config import GateConfig
from strict_gate.gate.rescorer_proof import prove_rescorer
from strict_gate.judge import restore
from strict_gate.judge.cascade import Cascade, stop_problem
from strict_gate.judge.compare import Comparison
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.diagnose import Diagnosis, cross_check, diagnose, not_started, score_candidate, stored_check
from strict_gate.judge.policy import Policy, apply_policy, check_policy
from strict_gate.judge.resplit import DIVERGED, resplit
from strict_gate.judge.result import GateResult
from strict_gate.judge.schema import ReportDoc
from strict_gate.judge.spec import ConfigRef, GateSpec, PromptSetRef
from strict_gate.judge.text_only import TEXT_ONLY, is_text_only, run_decoder, run_speller, text_only_notes
from strict_gate.runs.determinism import determinism_summary
from strict_gate.runs.layout import RunDir
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import Record, Run, Sampling, now_iso


def gate_spec(cfg: GateConfig, ps: PromptSet, *, policy: Policy | str | None = None, band: float | None = None,
              config: ConfigRef | None = None) -> GateSpec:
    """A gate's spec: the config's settings, with the command line's policy and band over them.
    `config` is where the config came from (a resumed gate's, from its state); by default cfg's file.
    The command line's policy name is checked here, once (the config's was when it was read); the
    spec passes the Policy on, and the judgement its rule."""
    return GateSpec(
        name=cfg.name,
        prompt_set=PromptSetRef.of(ps, str(cfg.prompts)),
        sampling=Sampling(cfg.max_tokens, cfg.top_logprobs),
        policy=check_policy(policy) if policy else cfg.policy,
        band=cfg.band if band is None else band,
        greedy_tolerance=cfg.greedy_tolerance,
        config=config or ConfigRef(str(Path(cfg.path).resolve()), str(cfg.reference.base_dir)),
    )


def compare(spec: GateSpec, ref: Run, cand: Run) -> Comparison:
    ids = spec.prompt_set.ids
    return compare_runs(ref.records, cand.records, band=spec.band, prompt_ids=None if ids is None else list(ids),
                        greedy_tolerance=spec.greedy_tolerance, decode=run_decoder(cand))


def _unfinished(ref: Run, cand: Run, problems: Sequence[str]) -> list[str]:
    """A run that did not complete, unless a problem about its arm already says why."""
    return [f"{label} run is {run.manifest.status}: {run.manifest.error or 'not finished'}"
            for label, run in (("reference", ref), ("candidate", cand))
            if not run.complete and not any(p.startswith(label) for p in problems)]


NOT_SCORED = "no candidate engine re-scored it"


def stops_of(spec: GateSpec, ref: Run, cand: Run, comparison: Comparison) -> dict[str, str]:
    """Why each diverged prompt's early stop is not judged (cascade.stop_problem), by prompt."""
    eos = run_stop_ids(ref, cand)
    out = {}
    for pc in comparison.prompts:
        rec = cand.records.get(pc.id) if pc.status in DIVERGED else None
        why = None if rec is None or rec.error is not None else \
            stop_problem(rec.token_ids, rec.finish_reason, spec.sampling.max_tokens, eos)
        if why is not None:
            out[pc.id] = why
    return out


def later_of(diagnoses: Mapping[str, Diagnosis]) -> dict[str, Cascade]:
    """Each diagnosed prompt's later positions, judged: what the near-tie policy needs (as GateResult.later)."""
    return {pid: dg.later for pid, dg in diagnoses.items() if dg.later is not None}


def _resplit(spec: GateSpec, ref: Run, cand: Run, comparison: Comparison, rescorer: Engine,
             notes: tuple[str, ...]) -> tuple[Comparison, Mapping[str, Record], tuple[str, ...]]:
    """A text-only candidate's diverged replies split into tokens as the reference would
    (judge/resplit.py) before they are re-scored; a failure leaves them as stored, said so."""
    decode, spell = run_decoder(cand), run_speller(cand)
    if decode is None or spell is None or not any(p.status in DIVERGED for p in comparison.prompts):
        return comparison, cand.records, notes

    def score(prompt, ids, k):
        with rescorer.scoped_env():
            rescorer.start()
            return rescorer.score(prompt, ids, k)

    try:
        comparison, records, n = resplit(comparison, ref.records, cand.records, score, spec.sampling.top_logprobs,
                                         decode, spell, band=spec.band, greedy_tolerance=spec.greedy_tolerance)
    except Exception as e:  # the stored split is judged instead: stricter, never looser
        return comparison, cand.records, (*notes, f"re-splitting the text-only replies failed: {type(e).__name__}: {e}")
    said = (f"{n} diverged text-only repl(ies) split into tokens as the reference would (teacher forcing along "
            "its own choices; the text unchanged) before re-scoring") if n else None
    return comparison, records, (*notes, *((said,) if said else ()))


def _rescore(spec: GateSpec, ref: Run, cand: Run, comparison: Comparison, rescorer: Engine, notes: tuple[str, ...], *,
             prove: bool) -> tuple[Comparison, Mapping[str, Record], tuple[str, ...], Mapping[str, Diagnosis]]:
    """The divergences re-scored by `rescorer`, once it proved it is the recorded reference (when
    `prove`): a text-only candidate's replies re-split, then each diverged prompt diagnosed. An
    engine that did not start for its proof is not started again: every prompt says so."""
    if prove and any(p.status in DIVERGED for p in comparison.prompts):
        failed = prove_rescorer(rescorer, ref, comparison, band=spec.band, k=spec.sampling.top_logprobs)
        if failed is not None:
            return comparison, cand.records, notes, not_started(comparison, failed)
    comparison, records, notes = _resplit(spec, ref, cand, comparison, rescorer, notes)
    return comparison, records, notes, diagnose(comparison, ref.records, records, rescorer, spec.sampling.top_logprobs)


def judge(spec: GateSpec, ref: Run, cand: Run, *, problems: Sequence[str] = (), rescorer: Engine | None = None,
          comparison: Comparison | None = None, recorded_by_rescorer: bool = False) -> GateResult:
    """Judge two runs by the spec: compare them (unless the caller already has), (given a
    scoring engine) diagnose the divergences and classify them again with the re-scored
    reference side, and apply the policy. cross_judge adds the candidate's side.

    The rescorer first proves it is the recorded reference (gate/rescorer_proof.py: exit 3 when
    not), unless it is the very engine that recorded the whole reference run in this process
    (`recorded_by_rescorer`: a gate's live reference, started once)."""
    problems = [*problems, *_unfinished(ref, cand, problems)]
    if comparison is None:
        comparison = compare(spec, ref, cand)
    diagnoses: Mapping[str, Diagnosis] = {}
    cand_records, notes = cand.records, text_only_notes(comparison.prompts, cand) if is_text_only(cand) else ()
    if rescorer is not None and rescorer.can_score:
        with engine_log(RunDir(Path(ref.path)).engine_log, rescorer.log_libraries):  # a rescorer's start-up too
            comparison, cand_records, notes, diagnoses = _rescore(spec, ref, cand, comparison, rescorer, notes,
                                                                  prove=not recorded_by_rescorer)
    comparison, diagnoses = cross_check(comparison, diagnoses, {}, cand_records,
                                        not_scored=TEXT_ONLY if is_text_only(cand) else NOT_SCORED)
    diagnoses = spec.rule.diagnoses(comparison, diagnoses)
    verdict = apply_policy(comparison, spec.rule, ref.records, cand.records, run_problems=tuple(problems),
                           later=later_of(diagnoses), diagnoses=diagnoses, stops=stops_of(spec, ref, cand, comparison))
    sampled = any(r.samples for r in ref.records.values())  # a generator: no list of every record
    resumed = {label: list(run.manifest.resumed) for label, run in (("reference", ref), ("candidate", cand))}
    return GateResult(
        name=spec.name,
        created=now_iso(),
        verdict=verdict,
        comparison=comparison,
        reference=ref.manifest.engine,
        candidate=cand.manifest.engine,
        prompt_set=dict(spec.prompt_set.described),
        sampling=spec.sampling,
        reference_records=ref.records,
        candidate_records=cand_records,
        diagnoses=diagnoses,
        runs={"reference": ref.path, "candidate": cand.path},
        determinism=determinism_summary(ref.records.values()) if sampled else None,
        problems=tuple(problems),
        config=spec.config.to_json() if spec.config is not None else None,
        rescored_by=f"{rescorer.kind} {rescorer.info().model}" if rescorer is not None and diagnoses else None,
        resumed={label: entries for label, entries in resumed.items() if entries},
        notes=notes,
    )


def stored_diagnoses(report: ReportDoc) -> dict[str, Diagnosis]:
    """Each prompt's diagnosis as a finished gate's report.json holds it (read by load_report, so
    a malformed one was bad input there)."""
    return {p.id: restore.diagnosis(p.diagnosis) for p in report.prompts if p.diagnosis is not None}


def judge_stored(spec: GateSpec, ref: Run, cand: Run, diagnoses: Mapping[str, Diagnosis], *,
                 problems: Sequence[str] = ()) -> GateResult:
    """A finished gate judged again without a scoring engine, from the diagnoses its report
    stored (both sides' re-scored gaps, every later position): the verdict it wrote, not the
    'unverified' a judgement without re-scoring gives its near-ties."""
    result = judge(spec, ref, cand, problems=problems)
    if not diagnoses:
        return result
    comparison = stored_check(result.comparison, diagnoses)
    verdict = apply_policy(comparison, spec.rule, ref.records, cand.records, run_problems=result.problems,
                           later=later_of(diagnoses), diagnoses=diagnoses, stops=stops_of(spec, ref, cand, comparison))
    return replace(result, comparison=comparison, diagnoses=dict(diagnoses), verdict=verdict)


def cross_judge(spec: GateSpec, ref: Run, cand: Run, result: GateResult, candidate: Engine) -> GateResult:
    """The verdict again, with the candidate's side of every diverged prompt re-scored where the
    candidate can score (its gap on the common prefix), else stated unknown with the reason; an
    unknown gap keeps a prompt divergent. The comparison is re-derived from the stored gaps, so
    judging twice gives the same result."""
    if candidate.can_score:
        with engine_log(RunDir(Path(cand.path)).engine_log, candidate.log_libraries):
            scores = score_candidate(result.comparison, ref.records, cand.records, candidate,
                                     spec.sampling.top_logprobs)
        why = NOT_SCORED
    else:
        scores, why = {}, TEXT_ONLY if is_text_only(cand) else f"the candidate engine ({candidate.kind}) cannot score"
    comparison, diagnoses = cross_check(result.comparison, result.diagnoses, scores, result.candidate_records,
                                        not_scored=why)
    diagnoses = spec.rule.diagnoses(comparison, diagnoses)
    verdict = apply_policy(comparison, spec.rule, ref.records, cand.records, run_problems=result.problems,
                           later=later_of(diagnoses), diagnoses=diagnoses, stops=stops_of(spec, ref, cand, comparison))
    return replace(result, comparison=comparison, diagnoses=diagnoses, verdict=verdict)
