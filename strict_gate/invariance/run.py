"""Run the [invariance] variants of each named arm into <report dir>/invariance/<arm>/<variant>/.

Per arm, one engine at a time: the arm's engine runs its own batch-1 run and every variant it
serves as it is (batches, requests in flight, needles, the prefix cache when it is on), then
each prefill chunk size gets an engine of its own (for vLLM a new engine; for a command
engine the same binary, started afresh), and so does a prefix cache the arm had turned off,
and each state-boundary prefix hit (a fresh cache); those hits run only where the arm serves a
prefix cache, the others named under the result config's `not_served` (Variant.where_served).
Engine start-up is timed apart, so a variant's cost is its serving time over the batch-1
run's. Runs go through the gate's own runner (`Runner`, gate/kept.py's Runs over gate/arm.py's
run_arm): same run format, same audit, same seals; a run that fails keeps its prompts and makes
its variant incomplete. A speculative variant gets an engine of its own too
(engine.with_speculative), and its acceptance counts are the engine's counters read before and
after each of its runs, sealed beside a run that finished (gate/acceptance.py).

A resumed gate keeps every run an interrupted attempt finished, a speculative one with the
counts sealed beside it (an engine whose runs were all kept is not started), and continues an
unfinished one where its kind allows (`restarts`); a variant with a run kept or continued is
timed by its records' own timings, the wall clock of each prompt as the gate measured it then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from strict_gate.core.engine_log import engine_log
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.engines.speculative import Acceptance
from strict_gate.errors import EngineError, IncompleteRunError
from strict_gate.invariance.config import BASELINE, SERVING, InvarianceConfig, InvariancePolicy, Variant, VariantKind
from strict_gate.invariance.continuation import judge_later_of
from strict_gate.invariance.variants import VariantEngine, unexercised
from strict_gate.invariance.verdict import CAUSES, InvarianceResult, VariantResult, judge_variant, not_run
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run

# the variants whose prompts are served one at a time, each on its own: a run continues from its last record
ON_THEIR_OWN = (VariantKind.BASELINE, VariantKind.CHUNKED_PREFILL, VariantKind.PREFIX_CACHE)


class Runner(Protocol):
    """Runs an engine over the prompts into a run directory (a gate's: gate/kept.py's Runs)."""

    def kept(self, out: Path) -> Run | None:
        """The run an interrupted attempt finished in `out`; None: it is run."""

    def kept_acceptance(self, out: Path) -> Acceptance | str | None:
        """The acceptance counts sealed beside the finished run in `out` (None: the engine kept
        none), or why they are not trusted: the run is then made again."""

    def seal_acceptance(self, out: Path, run: Run, acceptance: Acceptance | None) -> None:
        """The counts of the run just made in `out`, sealed beside it when it finished."""

    def run(self, engine: Engine, prompts: Sequence[PromptInput], out: Path, label: str, *,
            continues: bool = True) -> Run:
        """The run, an unfinished one in `out` continued from its last record when `continues`."""


def restarts(v: Variant) -> str:
    """Why an unfinished run of `v` starts over on a resume ("": it continues from its last record).
    Batches, requests in flight and needles are drawn over the whole prompt set, so a run cut
    short cannot be continued as the same variant; a speculative run's acceptance counts are the
    engine's counters over the whole run, sealed only once it finished (`counted`)."""
    if v.kind in ON_THEIR_OWN:
        return ""
    if counted(v):
        return "its acceptance counts are the engine's counters over the whole run, sealed only once it finishes"
    return "it serves prompts together, drawn over the whole prompt set"


def counted(v: Variant) -> bool:
    """A finished run of `v` is kept only with its acceptance counts sealed beside it: they are
    on no record (a speculative variant's)."""
    return v.kind == VariantKind.SPECULATIVE


def _since(after: Acceptance | None, before: Acceptance | None) -> Acceptance | None:
    """The counts one run added (an engine whose counters appear with its first draft: all of them)."""
    return after.since(before) if after is not None and before is not None else after


def _total(counts: Sequence[Acceptance | None]) -> Acceptance | None:
    """A variant's counts over its runs; None when no run's are known."""
    known = [c for c in counts if c is not None]
    return sum(known[1:], known[0]) if known else None


def _dirs(out: Path, v: Variant, repeats: int) -> list[Path]:
    if repeats == 1 or v is BASELINE:
        return [out / v.name]
    return [out / f"{v.name}.r{k}" for k in range(1, repeats + 1)]


def planned(inv: InvarianceConfig, inputs: Sequence[PromptInput], out_dir: Path) -> list[tuple[str, Variant, Path]]:
    """(arm, variant, run directory) of every run `run_invariance` may make, arm by arm (a command
    engine's hello may still leave out a variant run only where served)."""
    variants = [BASELINE, *(v for v in inv.variants if unexercised(v, inputs) is None)]
    return [(arm, v, d) for arm in inv.arms for v in variants if (arm, v.name) not in inv.unserved
            for d in _dirs(out_dir / arm, v, inv.repeats)]


def _timed_by_records(runs: Sequence[Run]) -> float:
    """The runs' serving time as their records say it (each prompt's wall clock, as measured then)."""
    return sum(r.timing.total_s for run in runs for r in run.records.values() if r.timing and r.timing.total_s)


def served_no_cache(arm: str, v: Variant, run: Run) -> str | None:
    """A prefix-cache variant's run whose engine says it served no prefix cache (vLLM's effective
    `enable_prefix_caching`, which it keeps off for a hybrid model unless asked): no prompt hit a
    cached prefix, so the variant judged nothing and is incomplete, never a pass."""
    effective = run.manifest.engine.options.get("effective")
    if isinstance(effective, dict) and effective.get("enable_prefix_caching") is False:
        return (f"{arm} {v.name}: the engine served no prefix cache (its effective enable_prefix_caching is "
                f"false), so no prompt hit a cached prefix")
    return None


class _Arm:
    """One arm's variants: its engines in turn, its batch-1 run, the runs of each variant."""

    def __init__(self, arm: str, inv: InvarianceConfig, inputs: Sequence[PromptInput], out: Path, runner: Runner,
                 band: float):
        self.arm, self.inv, self.inputs, self.out, self.runner, self.band = arm, inv, inputs, out, runner, band
        self.baseline: Run | None = None
        self.baseline_s: float | None = None
        self.results: list[VariantResult] = []
        self.pending: list[_Ran] = []
        self.untrusted: dict[Path, str] = {}  # a finished run made again: why its sealed counts were refused
        self.unserved: list[str] = []  # variants run only where served (Variant.where_served) it left out

    def _kept(self, v: Variant, out: Path) -> tuple[Run, Acceptance | None] | None:
        """The run of `v` an interrupted attempt finished in `out`, with its sealed acceptance counts
        when `counted`; None: it is made (again)."""
        run = self.runner.kept(out)
        if run is None or not counted(v):
            return None if run is None else (run, None)
        counts = self.runner.kept_acceptance(out)
        if isinstance(counts, str):
            self.untrusted[out] = counts
            return None
        return run, counts

    def _all_kept(self, v: Variant) -> bool:
        """An interrupted attempt finished every run of `v` (a speculative one with its counts)."""
        return all(self._kept(v, out) is not None for out in _dirs(self.out, v, self.inv.repeats))

    def served(self, engine: Engine, variants: Sequence[Variant]) -> list[Variant]:
        """The variants `engine` serves, the others left out where that is their rule (a command
        engine's hello narrows its servings at start, so this is asked before and after)."""
        out = [v for v in variants if not (v.where_served and SERVING[v.kind] not in engine.servings)]
        self.unserved += [v.name for v in variants if v not in out and v.name not in self.unserved]
        return out

    def serve(self, engine: Engine, variants: Sequence[Variant]) -> None:
        """Start `engine`, run the variants on it, stop it; a start failure leaves them not run.
        Variants whose runs were all kept need no engine: it is not started for them alone."""
        if all(self._all_kept(v) for v in variants):
            for v in variants:
                self._variant(engine, v)  # every run kept: the engine is not asked for anything
            return
        first = _dirs(self.out, variants[0], self.inv.repeats)[0]
        first.mkdir(parents=True, exist_ok=True)
        if engine.writes_log:
            engine.set_log_path(first / "engine.log")
        try:
            with engine.scoped_env(), engine_log(first / "engine.log", engine.log_libraries):
                engine.start()
        except Exception as e:
            why = f"the {engine.kind} engine did not start: {type(e).__name__}: {e}"
            lost = self.inv.variants if BASELINE in variants else variants  # no batch-1 run: none can be judged
            self.results += [not_run(v.name, self.arm, why) for v in lost]
            engine.close()
            return
        try:
            for v in self.served(engine, variants):
                self._variant(engine, v)
        finally:
            with engine_log(first / "engine.log", engine.log_libraries):
                engine.close()

    def _variant(self, engine: Engine, v: Variant) -> None:
        if v is not BASELINE and self.baseline is None:
            return  # the batch-1 run failed: the variant was marked not run
        runs, problems, fresh, counts, served = [], [], True, [], 0.0
        for k, out in enumerate(_dirs(self.out, v, self.inv.repeats), start=1):
            label = f"{self.arm} {v.name}" + (f" ({k}/{self.inv.repeats})" if self.inv.repeats > 1 and v is not BASELINE
                                             else "")
            kept = self._kept(v, out)
            if kept is not None:
                runs.append(kept[0])
                counts.append(kept[1])
                fresh = False
                continue
            if out in self.untrusted:  # the resume says why it makes a finished run again
                label += f" (made again: {self.untrusted[out]})"
            variant = VariantEngine(engine, v, needle_max=self.inv.needle_max, seed=self.inv.seed)
            before = engine.acceptance() if counted(v) else None
            t0 = time.perf_counter()  # serving time only: reading and sealing the counts is not the variant's cost
            try:
                runs.append(self.runner.run(variant, self.inputs, out, label, continues=not restarts(v)))
            except (EngineError, IncompleteRunError) as e:
                problems.append(f"{self.arm} {v.name} engine failed: {e}")
                runs.append(load_run(out, allow_incomplete=True))
            served += time.perf_counter() - t0
            if counted(v):
                counts.append(_since(engine.acceptance(), before))
                self.runner.seal_acceptance(out, runs[-1], counts[-1])  # a failed run is not finished: none
            fresh = fresh and not runs[-1].manifest.resumed
        seconds = served if fresh else _timed_by_records(runs)
        accepted = _total(counts) if counted(v) else None
        if v is BASELINE:
            self.baseline, self.baseline_s = runs[0], seconds
            if problems:  # nothing can be compared with a batch-1 run that failed
                self.baseline = None
                self.results += [not_run(x.name, self.arm, f"the batch-1 run failed: {problems[0]}")
                                 for x in self.inv.variants]
            return
        if v.kind == VariantKind.PREFIX_CACHE:
            problems += [p for r in runs if (p := served_no_cache(self.arm, v, r)) and p not in problems]
        self.pending.append(_Ran(v, runs, problems, seconds, accepted))

    def judge(self, build: Callable[[], Engine]) -> None:
        """Every variant that ran, judged; under policy near-tie its near-ties' continuations are
        re-scored first by a fresh engine of the arm (continuation.py), started only when needed."""
        if self.baseline is None:
            return
        near = [i for i, r in enumerate(self.pending) if not r.variant.exact] \
            if self.inv.policy == InvariancePolicy.NEAR_TIE else []
        judged = dict(zip(near, judge_later_of(
            [(self.baseline, self.pending[i].runs) for i in near], build, self.band,
            self.baseline.manifest.sampling.top_logprobs, self.out / "rescore" / "engine.log"))) if near else {}
        for i, r in enumerate(self.pending):
            v = r.variant
            self.results.append(judge_variant(v.name, self.arm, self.baseline, r.runs, policy=self.inv.policy,
                                              band=self.band, problems=r.problems, seconds=r.seconds,
                                              baseline_seconds=self.baseline_s, cause=CAUSES.get(v.kind, "batch"),
                                              exact=v.exact, acceptance=r.acceptance, judged=judged.get(i)))


@dataclass(frozen=True)
class _Ran:
    """A variant's runs, waiting to be judged."""

    variant: Variant
    runs: list[Run]
    problems: list[str]
    seconds: float
    acceptance: Acceptance | None


def _engines(base: Engine, variants: Sequence[Variant], build: Callable[[], Engine]
             ) -> list[tuple[Engine, list[Variant]]]:
    """Which engine serves which variants, in the order they run (the base engine first). A
    state-boundary prefix hit gets a fresh engine of the arm (`build`) each: on the base engine the
    batch-1 run has already cached every prompt's checkpoints, so every hit would land on them."""
    shared = [v for v in variants if v.kind == VariantKind.PREFIX_CACHE and not v.where_served]
    cache = base.with_prefix_cache() if shared else base
    own = [v for v in variants if v.kind not in (VariantKind.CHUNKED_PREFILL, VariantKind.SPECULATIVE)
           and not v.where_served and not (v.kind == VariantKind.PREFIX_CACHE and cache is not base)]
    plan: list[tuple[Engine, list[Variant]]] = [(base, [BASELINE, *own])]
    plan += [(base.with_prefill_chunk(v.size or 0), [v]) for v in variants if v.kind == VariantKind.CHUNKED_PREFILL]
    plan += [(base.with_speculative(v.spec), [v]) for v in variants if v.spec is not None]
    if cache is not base:
        plan.append((cache, shared))
    plan += [(build().with_prefix_cache(), [v]) for v in variants if v.where_served]
    return plan


def run_invariance(inv: InvarianceConfig, builders: dict[str, Callable[[], Engine]], inputs: Sequence[PromptInput],
                   out_dir: Path, runner: Runner, *, band: float) -> InvarianceResult:
    """Every arm of `inv.arms`: its batch-1 run, then its variants, each judged against it."""
    results: list[VariantResult] = []
    baselines, unserved = {}, {}
    skipped = {v: why for v in inv.variants if (why := unexercised(v, inputs)) is not None}
    for arm in inv.arms:
        a = _Arm(arm, inv, inputs, out_dir / arm, runner, band)
        base = builders[arm]()
        offered = a.served(base, [v for v in inv.variants if v not in skipped])
        for engine, variants in _engines(base, offered, builders[arm]):
            if a.baseline is None and BASELINE not in variants:
                break  # the batch-1 run failed: every variant was marked not run
            variants = a.served(base, variants)  # once started, the base engine's hello speaks for its copies
            if variants:
                a.serve(engine, variants)
        a.judge(builders[arm])
        unserved[arm] = a.unserved
        said = {r.name for r in a.results}
        results += a.results + [not_run(v.name, arm, why) for v, why in skipped.items() if v.name not in said]
        if a.baseline is not None:
            baselines[arm] = a.baseline.path
    order = {v.name: i for i, v in enumerate(inv.variants)}
    results.sort(key=lambda r: (inv.arms.index(r.arm), order.get(r.name, len(order))))
    config = inv.to_json() | ({"not_served": unserved} if any(unserved.values()) else {})
    return InvarianceResult(inv.policy, band, config, tuple(results), baselines)
