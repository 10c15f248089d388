"""A variant's near-tie flips judged after the flip, as the gate judges a candidate's.

Under policy near-tie a variant whose first divergence from the batch-1 run is a near-tie
passes only when every later token, on the variant's own prefix, is the batch-1 engine's
argmax there or a further near-tie (judge/cascade.py). After an arm's variants ran, its engine
is started once more, as it serves the batch-1 run, to teacher-force each such continuation:
judge/diagnose.py's diagnose and cross_check, the gate's own path (the first divergence
classified again with its re-scored gap, every later position judged, the variant's side its
decode top-k). An engine that cannot score, or fails to, leaves them unjudged: the variant is
incomplete, never a pass. A variant that stopped early after its flip is judged in verdict.py,
by the gate's own cascade.stop_problem: what it never emitted is unjudged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.engines.base import Engine
from strict_gate.judge.cascade import Cascade
from strict_gate.judge.compare import Comparison, PromptComparison, Status, with_prompts
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.judge.diagnose import cross_check, diagnose
from strict_gate.runs.records import Run

VARIANT_SIDE = "a variant's run is judged on its decode top-k (the variant does not re-score its own tokens)"


@dataclass(frozen=True)
class Judged:
    """One variant run against the batch-1 run: the comparison, each near-tie's later positions
    judged, and why those without a judgement have none."""

    comparison: Comparison
    later: Mapping[str, Cascade] = field(default_factory=dict)
    unjudged: str = "the arm's engine was not asked to re-score"


def needs_later(p: PromptComparison) -> bool:
    """A near-tie with a token after its flip: what follows must be judged."""
    d = p.first_divergence
    return p.status == Status.NEAR_TIE and d is not None and p.candidate_length > d.position + 1


def compared(baseline: Run, run: Run, band: float) -> Judged:
    ids = list(baseline.manifest.prompt_ids or baseline.records)
    return Judged(compare_runs(baseline.records, run.records, band=band, prompt_ids=ids))


def _rescored(j: Judged, baseline: Run, run: Run, engine: Engine, k: int) -> Judged:
    todo = tuple(p for p in j.comparison.prompts if needs_later(p))
    if not todo:
        return j
    sub = replace(j.comparison, prompts=todo)
    diagnoses = diagnose(sub, baseline.records, run.records, engine, k)
    sub, out = cross_check(sub, diagnoses, {}, run.records, not_scored=VARIANT_SIDE)
    return Judged(with_prompts(j.comparison, sub.prompts), {pid: dg.later for pid, dg in out.items() if dg.later})


def judge_later_of(pending: list[tuple[Run, list[Run]]], build: Callable[[], Engine], band: float,
                   k: int, log: Path) -> list[list[Judged]]:
    """Each variant's runs compared with its batch-1 run and, where a near-tie has tokens after
    it, re-scored by a fresh engine of the arm (started only when one has; its own output into
    `log`)."""
    judged = [[compared(base, r, band) for r in runs] for base, runs in pending]
    if not any(needs_later(p) for js in judged for j in js for p in j.comparison.prompts):
        return judged
    engine = build()
    log.parent.mkdir(parents=True, exist_ok=True)
    if engine.writes_log:
        engine.set_log_path(log)
    with engine_log(log, engine.log_libraries):
        try:
            why = _unable(engine)
            if why is not None:
                return [[replace(j, unjudged=why) for j in js] for js in judged]
            return [[_rescored(j, base, r, engine, k) for j, r in zip(js, runs)]
                    for js, (base, runs) in zip(judged, pending)]
        finally:
            engine.close()


def _unable(engine: Engine) -> str | None:
    """Why the arm's engine cannot re-score (it did not start, it has no score op), or None."""
    try:
        with engine.scoped_env():
            engine.start()
    except Exception as e:
        return f"the arm's engine did not start to re-score: {type(e).__name__}: {e}"
    if not engine.can_score:
        return f"the arm's {engine.kind} engine cannot score, so nothing re-scores the tokens after the flip"
    return None
