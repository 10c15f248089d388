"""The invariance phase of a gate, and `strict-gate invariance`: the [invariance] variants alone.

In a gate the phase runs last, after both arms are stopped (one engine loaded at a time), and
its result rides in the GateResult (report.json's `invariance`). Its runs are made through the
gate's runner (gate/kept.py), sealed as the arms' are: a resumed gate keeps every batch-1 run and
variant run an interrupted attempt finished (a speculative one with its sealed acceptance counts)
and continues an unfinished one where its kind allows (invariance/run.py's `restarts`). Alone, it
writes its own report directory: gate.toml, gate-state.json (its seal key, for `strict-gate
invariance --resume`), the runs under invariance/, invariance.json (last), .md, .html and junit.xml.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import redact_toml, scrub_tree
from strict_gate.engines.base import PromptInput
from strict_gate.errors import ConfigError, GateInterrupted, InputError
from strict_gate.gate.arm import prompt_inputs
from strict_gate.gate.config import GateConfig
from strict_gate.gate.interrupt import interrupted
from strict_gate.gate.judgement import gate_spec
from strict_gate.gate.kept import Planned, Runs
from strict_gate.gate.state import GateState, reopen, report_lock, write_gate_state
from strict_gate.invariance.config import BASELINE, of
from strict_gate.invariance.load import load_invariance
from strict_gate.invariance.moves import paired
from strict_gate.invariance.render import FILES, write_invariance_reports
from strict_gate.invariance.run import Runner, counted, planned, restarts, run_invariance
from strict_gate.invariance.verdict import InvarianceResult
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.output import ensure_writable_dir
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.records import Sampling, write_text_atomic

INVARIANCE_DIR = "invariance"
COMMAND = "invariance"  # gate-state.json's `command`: this directory is continued by `invariance --resume`


@dataclass(frozen=True)
class InvarianceOutcome:
    result: InvarianceResult
    report_dir: Path
    finished_already: bool = False  # `--resume` of a finished directory: nothing run, nothing rewritten


def invariance_phase(cfg: GateConfig, inputs: list[PromptInput], report_dir: Path, runner: Runner) -> InvarianceResult:
    """Every variant of cfg.invariance into report_dir/invariance/, through the gate's runner; with
    both arms, the candidate's judged against the reference's own moves (moves.py)."""
    inv = of(cfg)
    assert inv is not None
    builders = {role: (cfg.reference if role == "reference" else cfg.candidate).build_in_driver  # type: ignore[union-attr]
                for role in inv.arms}  # a Ray arm's variants: one engine in this process, not its pool
    try:
        return paired(run_invariance(inv, builders, inputs, report_dir / INVARIANCE_DIR, runner, band=cfg.band))
    finally:
        scrub_tree(report_dir / INVARIANCE_DIR)  # engine logs too: a server may log its key


def planned_runs(cfg: GateConfig, inputs: list[PromptInput], report_dir: Path) -> tuple[Planned, ...]:
    """The phase's run directories, each named as an interrupt names it, with how a resume treats it."""
    inv = of(cfg)
    assert inv is not None
    return tuple(Planned("invariance", f"{arm} arm, {'the batch-1 run' if v is BASELINE else 'variant ' + d.name}", d,
                         restarts(v), counted=counted(v))
                 for arm, v, d in planned(inv, inputs, report_dir / INVARIANCE_DIR))


def run_invariance_gate(cfg: GateConfig, *, output_dir: Path | None = None, progress=None) -> InvarianceOutcome:
    """`strict-gate invariance CONFIG`: the [invariance] variants only (no token verdict)."""
    from strict_gate.gate.outcome import new_report_dir

    if of(cfg) is None:
        raise ConfigError("has no [invariance] table: nothing for `strict-gate invariance` to run", path=cfg.path)
    ps = load_prompts(cfg.prompts)
    out = output_dir or cfg.output_dir
    ensure_writable_dir(out)
    report = ReportDir(new_report_dir(out, f"{cfg.name}-invariance"))
    with report_lock(report):
        inputs = _tokenized(cfg, ps, report)
        write_text_atomic(report.gate_toml, redact_toml(Path(cfg.path).read_text(encoding="utf-8")))
        state = write_gate_state(report, cfg, ps, gate_spec(cfg, ps), command=COMMAND)  # what --resume needs
        return _play(cfg, ps, inputs, report, state, progress)


def resume_invariance_gate(report_dir: str | Path, *, progress=None) -> InvarianceOutcome:
    """`strict-gate invariance --resume REPORT_DIR`: an interrupted `strict-gate invariance` continued,
    its finished runs kept, as `gate --resume` continues a gate; a finished one is left as it is."""
    report = ReportDir(Path(report_dir))
    if not report.path.is_dir():
        raise InputError("not an invariance report directory", path=str(report.path))
    with report_lock(report):
        state, cfg, ps = reopen(report, COMMAND)
        done = report.path / FILES["json"]
        if done.exists():
            return InvarianceOutcome(load_invariance(json.loads(done.read_text(encoding="utf-8"))["invariance"]),
                                     report.path, finished_already=True)
        return _play(cfg, ps, _tokenized(cfg, ps, report), report, state, progress)


def _tokenized(cfg: GateConfig, ps: PromptSet, report: ReportDir) -> list[PromptInput]:
    """The prompts as the gate feeds them: tokenized by the reference, the very same ids."""
    tokenizer = cfg.reference.build()
    try:
        with engine_log(report.path / "tokenizer.log", tokenizer.log_libraries):
            return prompt_inputs(ps, tokenizer)
    finally:
        tokenizer.close()


def _play(cfg: GateConfig, ps: PromptSet, inputs: list[PromptInput], report: ReportDir, state: GateState,
          progress) -> InvarianceOutcome:
    """The variants into the directory (an interrupt says where it stopped and what --resume keeps), then
    the reports, invariance.json last."""
    runs = Runs(report, state, ps, Sampling(cfg.max_tokens, cfg.top_logprobs), progress)
    runs.where.phase = "invariance"
    try:
        result = invariance_phase(cfg, inputs, report.path, runs)
    except GateInterrupted:
        raise
    except KeyboardInterrupt:
        raise interrupted(runs, planned_runs(cfg, inputs, report.path), command=COMMAND) from None
    scrub_tree(report.path)  # tokenizer.log too, before the reports say the set is whole
    write_invariance_reports(result, report.path, name=cfg.name)
    return InvarianceOutcome(result, report.path)
