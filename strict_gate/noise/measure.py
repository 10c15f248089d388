"""Measure a reference against itself: each variation's self-flips, into one profile.

The variations, each compared with the run it varies:
  runs-K           the K captured runs of each prompt (a baseline's samples, or K live runs)
  rerun            the live engine's batch-1 run against the captured golden
  batch-N          N prompts together against the live batch-1 run (the invariance machinery)
  chunked_prefill-N  prefill N tokens at a time (where the engine serves it), likewise
  prefill-decode   the batch-1 run's own tokens teacher-forced: prefill argmax against decode argmax
  build:<name>     a second build of the reference (another engine or dtype) against the golden
The live runs go through the gate's runner (handed in, as for the invariance phase), so every
run is an ordinary audited run directory under the noise report directory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.engines.base import Engine, PromptInput, Serving
from strict_gate.errors import EngineError, IncompleteRunError
from strict_gate.invariance.config import InvarianceConfig, Variant, VariantKind
from strict_gate.invariance.run import Runner, run_invariance
from strict_gate.noise.flips import (
    FlipSite,
    Tally,
    run_sites,
    sample_sites,
    scored_sites,
    self_flip,
    variation,
)
from strict_gate.noise.profile import K_RUNS, SelfFlip, Variation
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, ScoredStep


@dataclass(frozen=True)
class NoisePlan:
    """What to vary. `builds` are second builds' runs by name, already made by the caller."""

    batch: tuple[int, ...] = (8,)
    chunked_prefill: tuple[int, ...] = ()
    prefill_decode: bool = True
    builds: Mapping[str, Run] = field(default_factory=dict)


@dataclass
class Measured:
    """The variations and flips as they are found, and what could not be run."""

    dtype: str
    variations: list[Variation] = field(default_factory=list)
    flips: list[SelfFlip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, kind: str, detail: str, found: tuple[list[FlipSite], Tally], *,
            same_build: bool = True) -> None:
        sites, tally = found
        flips = [self_flip(s, name, self.dtype) for s in sites]
        self.flips += flips
        self.variations.append(variation(name, kind, detail, flips, tally, same_build=same_build))


def k_runs(m: Measured, base: Run, k: int, source: str) -> None:
    if k >= 2:
        m.add(f"runs-{k}", K_RUNS, f"{k} runs of each prompt, one prompt per call ({source}), each against the "
              "first", sample_sites(base.records))


def live_variations(m: Measured, plan: NoisePlan, build: Callable[[], Engine], inputs: Sequence[PromptInput],
                    out: Path, run: Runner, golden: Run | None) -> Run | None:
    """The live engine's batch-1 run and its serving variants; returns the batch-1 run."""
    probe = build()
    servings = probe.servings
    probe.close()
    variants = [Variant(VariantKind.BATCH, n) for n in plan.batch if Serving.BATCH in servings]
    variants += [Variant(VariantKind.CHUNKED_PREFILL, n) for n in plan.chunked_prefill
                 if Serving.CHUNKED_PREFILL in servings]
    m.notes += [f"{name} not run: the {probe.kind} engine cannot serve it" for name, wanted, serving in (
        ("batch", plan.batch, Serving.BATCH), ("chunked prefill", plan.chunked_prefill, Serving.CHUNKED_PREFILL))
        if wanted and serving not in servings]
    inv = InvarianceConfig(arms=("reference",), variants=tuple(variants),
                           needle_max=max(plan.batch, default=2))
    result = run_invariance(inv, {"reference": build}, inputs, out, run, band=0.0)
    m.notes += [f"{r.name}: {p}" for r in result.variants for p in r.problems]
    base_path = result.baselines.get("reference")
    if base_path is None:
        m.notes.append("the live engine's batch-1 run failed: no serving variation was measured")
        return None
    base = load_run(base_path, allow_incomplete=True)
    if golden is not None:
        m.add("rerun", "rerun", "the live engine's batch-1 run against the captured golden",
              run_sites(golden.records, base.records))
    for v in variants:
        try:
            other = load_run(out / "reference" / v.name, allow_incomplete=True)
        except Exception as e:
            m.notes.append(f"{v.name}: no run to compare ({type(e).__name__}: {e})")
            continue
        what = (f"{v.size} prompts submitted together" if v.kind == VariantKind.BATCH
                else f"the prompt prefilled {v.size} tokens at a time")
        m.add(v.name, str(v.kind), what + ", against the live batch-1 run", run_sites(base.records, other.records))
    return base


def prefill_decode(m: Measured, build: Callable[[], Engine], base: Run, k: int, log: Path) -> None:
    """Teacher-force the batch-1 run's own tokens through the engine that decoded them; the
    engine's output goes to `log`."""
    engine = build()
    if not engine.can_score:
        m.notes.append(f"prefill-decode not run: the {engine.kind} engine cannot score")
        engine.close()
        return
    scored: dict[str, Sequence[ScoredStep]] = {}
    log.parent.mkdir(parents=True, exist_ok=True)
    if engine.writes_log:
        engine.set_log_path(log)
    try:
        with engine.scoped_env(), engine_log(log, engine.log_libraries):
            engine.start()
            for pid, rec in base.records.items():
                if rec.error is None and rec.token_ids:
                    scored[pid] = engine.score(rec.prompt_token_ids, rec.token_ids, k)
    except (EngineError, IncompleteRunError, RuntimeError, ValueError) as e:
        m.notes.append(f"prefill-decode stopped after {len(scored)} prompt(s): {type(e).__name__}: {e}")
    finally:
        with engine_log(log, engine.log_libraries):
            engine.close()
    if scored:
        m.add("prefill-decode", "prefill_decode", "each step's decode argmax against the argmax of the same "
              "tokens teacher-forced in one prefill", scored_sites(base.records, scored))


def second_builds(m: Measured, golden: Run, builds: Mapping[str, Run]) -> None:
    for name, other in builds.items():
        info = other.manifest.engine
        dtype = info.options.get("dtype")
        m.add(f"build:{name}", "second_build", f"another build of the reference ({info.kind}"
              f"{', ' + str(dtype) if dtype else ''}) against the golden", run_sites(golden.records, other.records),
              same_build=False)
