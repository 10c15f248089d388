"""The runs a gate's phases make under its report directory, and what an interrupted gate left of them.

Every run a gate starts, its arms' and a feature's (invariance's batch-1 runs and variants), is a
run directory under the report directory whose record lines are sealed with the gate's key and
the run's path in the directory (runs/seal.py): the arms' `candidate/` and `reference/`, a
variant's `invariance/candidate/batch-4/`. A resume keeps exactly what this gate wrote there: a
finished run is kept and its engine not started for it, an unfinished one continued from its last
sealed record where its kind allows (one prompt served on its own), else run again; a record that
does not match its seal is refused (exit 2), an unsealed tail (a kill between a record and its
seal) dropped, to be generated again. A speculative variant's run is kept only with its acceptance
counts, sealed beside it when it finished (gate/acceptance.py): the engine's counters, on no
record. A feature that runs engines makes its runs through
`Gate.runs()` and names them in `Feature.planned`, so it resumes as the arms do, and an interrupt
says what `--resume` keeps of it (gate/interrupt.py). `strict-gate invariance` and `strict-gate
noise` make their runs through a `Runs` of their own report directory, and resume the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from strict_gate.engines.base import Engine, PromptInput
from strict_gate.engines.speculative import Acceptance
from strict_gate.errors import EngineError, IncompleteRunError, InputError
from strict_gate.gate.acceptance import read_acceptance, write_acceptance
from strict_gate.gate.arm import finished_run, run_arm
from strict_gate.gate.outcome import ProgressHook
from strict_gate.gate.state import GateState
from strict_gate.runs.layout import ReportDir, RunDir
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, RunStatus, Sampling
from strict_gate.runs.seal import check_seal


@dataclass(frozen=True)
class Planned:
    """A run directory a phase writes: what an interrupt names, and what `--resume` does with it."""

    phase: str  # "candidate arm", "invariance"
    what: str  # within the phase: "" for an arm, "candidate arm, variant chunked_prefill-2"
    path: Path
    restarts: str = ""  # why an unfinished run starts over; "": it continues from its last record
    counted: bool = False  # a finished run is kept only with its sealed acceptance counts (a speculative variant's)

    @property
    def continues(self) -> bool:
        return not self.restarts

    @property
    def label(self) -> str:
        return f"{self.phase}, {self.what}" if self.what else self.phase


@dataclass
class Where:
    """How far a gate got, for the message an interrupt prints: its phase, the run in flight and
    the last run finished. Mutable on purpose: the phases move it along as they go."""

    phase: str = "start"
    run: Path | None = None
    last: Path | None = None


def sealed(run: Run, d: RunDir, key: str) -> Run:
    """The run with only the records its gate sealed: a line that does not match its seal is
    refused (exit 2); an unsealed tail (a kill between the record and its seal) is dropped,
    to be generated again, and in a complete run refused."""
    running = run.manifest.status == RunStatus.RUNNING and d.partial.exists()
    n = check_seal(d.partial if running else d.records, d.seal, key, whole=run.complete)
    if n == len(run.records):
        return run
    ids = list(run.records)[:n]  # records are read in file order
    return replace(run, records={i: run.records[i] for i in ids})


@dataclass(frozen=True)
class Runs:
    """A gate's runs under its report directory: each made sealed, each read back as its seal allows."""

    report: ReportDir
    state: GateState
    ps: PromptSet
    sampling: Sampling
    progress: ProgressHook | None = None
    where: Where = field(default_factory=Where)

    def key(self, out: Path) -> str:
        """The seal key of the run in `out`: the gate's, and the run's place in the report
        directory (an arm's is its role), so a record moved between runs is refused."""
        return self.state.arm_key(out.resolve().relative_to(self.report.path.resolve()).as_posix())

    def stored(self, out: Path) -> Run | None:
        """The run in `out` as far as it got, its sealed records only; None: it never started."""
        if not RunDir(out).manifest.exists():
            return None
        run = load_run(out, allow_incomplete=True)
        m = run.manifest
        for name, have, want in (("prompt set sha256", m.prompt_set.get("sha256"), self.ps.sha256),
                                 ("max_tokens", m.sampling.max_tokens, self.sampling.max_tokens),
                                 ("top_logprobs", m.sampling.top_logprobs, self.sampling.top_logprobs)):
            if have != want:
                raise InputError(f"the stored run does not fit gate.toml: {name} is {have!r} in the run, {want!r} "
                                 "in the config; start a new gate", path=str(out))
        return sealed(run, RunDir(out), self.key(out))

    def kept(self, out: Path) -> Run | None:
        """The run an interrupted attempt finished in `out` (nothing left to generate), else None."""
        run = self.stored(out)
        return run if run is not None and finished_run(run, self.ps.ids) else None

    def kept_acceptance(self, out: Path) -> Acceptance | str | None:
        """The acceptance counts sealed beside the finished run in `out` (None: its engine kept
        none), or why they are not trusted: the run is then made again."""
        return read_acceptance(RunDir(out), self.key(out))

    def seal_acceptance(self, out: Path, run: Run, acceptance: Acceptance | None) -> None:
        """The acceptance counts of the run just made in `out`, sealed beside it when it finished
        (an unfinished one is made again whole: its counts cover only a part)."""
        if finished_run(run, self.ps.ids):
            write_acceptance(RunDir(out), self.key(out), acceptance)

    def run(self, engine: Engine, prompts: Sequence[PromptInput], out: Path, label: str, *,
            continues: bool = True, runs: int = 1) -> Run:
        """The run in `out` (each prompt `runs` times, one prompt per call, when above 1), sealed:
        an unfinished one continued from its last sealed record when `continues` (its kind serves
        each prompt on its own), else started over. An interrupt leaves `where` naming this run."""
        prior = self.stored(out) if continues else None
        on_record = None
        if self.progress:
            kept = sum(1 for r in prior.records.values() if r.error is None) if prior else 0
            on_record = self.progress(f"{label} (resumed, {kept} kept)" if kept else label, len(prompts) - kept)
        self.where.run = out
        RunDir(out).acceptance.unlink(missing_ok=True)  # an earlier attempt's counts are not this run's
        try:
            done = run_arm(engine, prompts, self.sampling, out, prompt_set=self.ps, runs=runs, on_record=on_record,
                           resume_from=prior, seal_key=self.key(out))
        except (EngineError, IncompleteRunError):
            self.where.run = None  # it failed and the phase goes on: no longer in flight
            raise
        self.where.run, self.where.last = None, out
        return done
