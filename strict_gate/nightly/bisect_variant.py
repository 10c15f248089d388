"""`strict-gate bisect --variant NAME` beside the reference's own moves.

When the gate's [invariance] has `arms` with "reference", vLLM may move under the variant too
(Kimi-Linear with where its prefill is cut), and a candidate that moves exactly as it does emits
its tokens. The reference's variant does not change across commits: it is run once, before the
first step (its batch-1 run and the variant, into <bisect dir>/reference-variant/), its result
written to reference-variant.json and named in the bisection's state, so no step and no later
bisect over the same directory runs it again. Each step's candidate variant is then judged beside
it by invariance/moves.py's `paired` (the gate's own rule): a commit is bad only where the
candidate moves where the reference stays, or both move differently; moving with the reference
is good.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from strict_gate.engines.base import Engine, PromptInput
from strict_gate.engines.speculative import Acceptance
from strict_gate.gate.config import GateConfig
from strict_gate.invariance.config import InvarianceConfig
from strict_gate.invariance.load import load_invariance
from strict_gate.invariance.moves import REFERENCE, paired
from strict_gate.invariance.run import run_invariance
from strict_gate.invariance.verdict import InvarianceResult
from strict_gate.judge.result import GateResult, with_feature
from strict_gate.report.text import strict_json
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import Run, Sampling, write_text_atomic

DIR = "reference-variant"
FILE = "reference-variant.json"


@dataclass(frozen=True)
class _Runner:
    """invariance/run.py's Runner for the bisection's one reference run: nothing kept, nothing sealed."""

    ps: PromptSet
    sampling: Sampling

    def kept(self, out: Path) -> Run | None:
        return None

    def kept_acceptance(self, out: Path) -> Acceptance | str | None:
        return None

    def seal_acceptance(self, out: Path, run: Run, acceptance: Acceptance | None) -> None:
        return None

    def run(self, engine: Engine, prompts: Sequence[PromptInput], out: Path, label: str, *,
            continues: bool = True) -> Run:
        from strict_gate.gate.arm import run_arm

        return run_arm(engine, prompts, self.sampling, out, prompt_set=self.ps)


def reference_variant(cfg: GateConfig, inv: InvarianceConfig, prompts: Path, out: Path) -> Path | None:
    """The reference's run of the one variant in `inv` (bisect.py's `only_variant`), made once into
    `out`; the path of its result, or None when the gate's [invariance] does not run the reference."""
    from strict_gate.gate.arm import prompt_inputs
    from strict_gate.invariance.config import of as invariance_of
    from strict_gate.runs.prompts import load_prompts

    full = invariance_of(cfg)
    if full is None or REFERENCE not in full.arms:
        return None
    path = out / FILE
    if path.exists():  # run once: kept for every step and any later run over this directory
        return path
    ps = load_prompts(prompts)
    tokenizer = cfg.reference.build()
    try:
        inputs = prompt_inputs(ps, tokenizer)
    finally:
        tokenizer.close()
    result = run_invariance(replace(inv, arms=(REFERENCE,)), {REFERENCE: cfg.reference.build}, inputs, out / DIR,
                            _Runner(ps, Sampling(cfg.max_tokens, cfg.top_logprobs)), band=cfg.band)
    write_text_atomic(path, json.dumps(strict_json(result.to_json()), indent=2, allow_nan=False) + "\n")
    return path


def judged_step(result: GateResult, path: str | Path) -> GateResult:
    """A step's gate result with its candidate variant judged beside the reference's stored one
    (its exit code then says 5 only for the candidate's own moves)."""
    inv = result.feature("invariance")
    if not isinstance(inv, InvarianceResult):
        return result
    ref = load_invariance(json.loads(Path(path).read_text(encoding="utf-8")))
    both = replace(inv, variants=(*inv.variants, *(v for v in ref.variants if v.arm == REFERENCE)))
    return with_feature(result, "invariance", paired(both))
