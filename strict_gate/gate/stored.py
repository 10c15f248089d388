"""What runs without a gate's phases: the reference captured K times into a baseline (`strict-gate
capture`). Two stored runs compared (`strict-gate compare`) live in offline/compare.py."""

from __future__ import annotations

from pathlib import Path

from strict_gate.engines.base import Engine
from strict_gate.gate.arm import prompt_inputs, run_arm
from strict_gate.gate.config import GateConfig
from strict_gate.gate.outcome import ProgressHook
from strict_gate.runs.output import staged_run_dir
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, Sampling
from strict_gate.shards.spec import Shard


def capture_baseline(
    cfg: GateConfig,
    out: Path,
    *,
    runs: int,
    progress: ProgressHook | None = None,
    engine: Engine | None = None,
    force: bool = False,
    shard: Shard | None = None,
) -> Run:
    """Run the reference K times per prompt (one prompt per call) into a baseline run with
    its determinism summary. A given `engine` is used as is and left open. `out` is replaced
    only by a finished capture, and a complete one there only with `force`. `shard` captures
    only its prompts (shards/spec.py; `strict-gate merge` joins the shards)."""
    whole = load_prompts(cfg.prompts)
    ps = shard.select(whole) if shard is not None else whole
    with staged_run_dir(out, force=force) as staged:
        reference = engine or cfg.reference.build()
        try:
            inputs = prompt_inputs(ps, reference)
            run_arm(
                reference, inputs, Sampling(cfg.max_tokens, cfg.top_logprobs), staged, prompt_set=ps, runs=runs,
                on_record=progress(f"capture x{runs}", len(inputs)) if progress else None,
                shard=shard.describe(len(whole)) if shard is not None else None,
            )
        finally:
            if engine is None:
                reference.close()
    return load_run(out)
