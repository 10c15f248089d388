"""The invariance phase of a gate, and `strict-gate invariance`: the [invariance] variants alone.

In a gate the phase runs last, after both arms are stopped (one engine loaded at a time), and
its result rides in the GateResult (report.json's `invariance`); a resumed gate runs it again
whole, on every prompt, into a fresh invariance/ (an interrupted attempt's runs are removed:
none of them, half-written, reads as a run of this one). Alone, it writes its own
report directory: gate.toml, the runs under invariance/, invariance.json (last), .md, .html
and junit.xml.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import redact_toml, scrub_tree
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError
from strict_gate.gate.arm import OnRecord, prompt_inputs, run_arm
from strict_gate.gate.config import GateConfig
from strict_gate.invariance.config import of
from strict_gate.invariance.render import write_invariance_reports
from strict_gate.invariance.run import run_invariance
from strict_gate.invariance.verdict import InvarianceResult
from strict_gate.runs.output import ensure_writable_dir
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.records import Run, Sampling, write_text_atomic

INVARIANCE_DIR = "invariance"


@dataclass(frozen=True)
class InvarianceOutcome:
    result: InvarianceResult
    report_dir: Path


def invariance_phase(cfg: GateConfig, ps: PromptSet, inputs: list[PromptInput], report_dir: Path,
                     progress=None) -> InvarianceResult:
    """Every variant of cfg.invariance into report_dir/invariance/, through the gate's runner."""
    inv = of(cfg)
    assert inv is not None
    sampling = Sampling(cfg.max_tokens, cfg.top_logprobs)

    def run(engine: Engine, prompts, out: Path, label: str) -> Run:
        on_record: OnRecord | None = progress(label, len(prompts)) if progress else None
        return run_arm(engine, prompts, sampling, out, prompt_set=ps, on_record=on_record)

    builders = {role: (cfg.reference if role == "reference" else cfg.candidate).build  # type: ignore[union-attr]
                for role in inv.arms}
    shutil.rmtree(report_dir / INVARIANCE_DIR, ignore_errors=True)  # a resumed gate's: an interrupted attempt's runs
    try:
        return run_invariance(inv, builders, inputs, report_dir / INVARIANCE_DIR, run, band=cfg.band)
    finally:
        scrub_tree(report_dir / INVARIANCE_DIR)  # engine logs too: a server may log its key


def run_invariance_gate(cfg: GateConfig, *, output_dir: Path | None = None, progress=None) -> InvarianceOutcome:
    """`strict-gate invariance CONFIG`: the [invariance] variants only (no token verdict)."""
    from strict_gate.gate.outcome import new_report_dir

    if of(cfg) is None:
        raise ConfigError("has no [invariance] table: nothing for `strict-gate invariance` to run", path=cfg.path)
    ps = load_prompts(cfg.prompts)
    out = output_dir or cfg.output_dir
    ensure_writable_dir(out)
    tokenizer = cfg.reference.build()  # the gate tokenizes with the reference: the very same ids
    report_dir = new_report_dir(out, f"{cfg.name}-invariance")
    with engine_log(report_dir / "tokenizer.log", tokenizer.log_libraries):
        inputs = prompt_inputs(ps, tokenizer)
    tokenizer.close()
    write_text_atomic(report_dir / "gate.toml", redact_toml(Path(cfg.path).read_text(encoding="utf-8")))
    result = invariance_phase(cfg, ps, inputs, report_dir, progress)
    scrub_tree(report_dir)  # tokenizer.log too, before the reports say the set is whole
    write_invariance_reports(result, report_dir, name=cfg.name)
    return InvarianceOutcome(result, report_dir)
