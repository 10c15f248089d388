"""Every file name of a report directory and of a run directory, said once.

A report directory (`<output_dir>/<gate>-<time>/`; `strict-gate bench` writes `<output_dir>/<gate>/`):

    gate.toml               the gate's config, secrets redacted (what --resume and diagnose re-read)
    gate-state.json         what `gate --resume` needs, written before any arm runs; sealed
    gate.lock               held (flock) by the gate or resume working in the directory
    candidate/ reference/   the arms' run directories
    invariance/<arm>/<run>/ [invariance]'s run directories, sealed as the arms' are (gate/kept.py)
    rescorer.log            a [rescorer] process's output
    localize-reference.log  a [localize.reference] process's output
    golden.log              a [golden] process's output
    golden.json             `strict-gate golden`'s check of the reference against the golden, sealed
    report.md report.html junit.xml
    report.json             written last: its presence means the set is whole
    speed.json              `strict-gate bench`'s figures
    diff.json summary.md    the nightly's night-to-night diff and its step summary

A run directory:

    manifest.json           the engine, prompt set, sampling and status
    records.jsonl.partial   the records while the run is running
    records.jsonl           the records of a finished run
    records.seal            a gate's running hash per record line (runs/seal.py)
    acceptance.json         a finished speculative variant's acceptance counts, sealed to the run (gate/acceptance.py)
    engine.log              the engine's own output (an in-process library's, a process's)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class RunFile(StrEnum):
    MANIFEST = "manifest.json"
    RECORDS = "records.jsonl"
    PARTIAL = "records.jsonl.partial"
    SEAL = "records.seal"
    ACCEPTANCE = "acceptance.json"
    ENGINE_LOG = "engine.log"


class ReportFile(StrEnum):
    GATE_TOML = "gate.toml"
    STATE = "gate-state.json"
    LOCK = "gate.lock"
    JSON = "report.json"
    MARKDOWN = "report.md"
    HTML = "report.html"
    JUNIT = "junit.xml"
    RESCORER_LOG = "rescorer.log"
    LOCALIZE_REFERENCE_LOG = "localize-reference.log"
    GOLDEN_LOG = "golden.log"
    GOLDEN = "golden.json"
    SPEED = "speed.json"
    DIFF = "diff.json"
    SUMMARY = "summary.md"


REPORT_FORMATS = {"json": ReportFile.JSON, "md": ReportFile.MARKDOWN, "html": ReportFile.HTML,
                  "junit": ReportFile.JUNIT}


@dataclass(frozen=True)
class RunDir:
    """One arm's run directory."""

    path: Path

    @property
    def manifest(self) -> Path:
        return self.path / RunFile.MANIFEST

    @property
    def records(self) -> Path:
        return self.path / RunFile.RECORDS

    @property
    def partial(self) -> Path:
        return self.path / RunFile.PARTIAL

    @property
    def engine_log(self) -> Path:
        return self.path / RunFile.ENGINE_LOG

    @property
    def seal(self) -> Path:
        return self.path / RunFile.SEAL

    @property
    def acceptance(self) -> Path:
        return self.path / RunFile.ACCEPTANCE


@dataclass(frozen=True)
class ReportDir:
    """One gate's report directory; its arms' run directories are named after their roles."""

    path: Path

    def arm(self, role: str) -> RunDir:
        return RunDir(self.path / role)

    def report(self, fmt: str) -> Path:
        """The file of one report format ("json", "md", "html", "junit")."""
        return self.path / REPORT_FORMATS[fmt]

    @property
    def gate_toml(self) -> Path:
        return self.path / ReportFile.GATE_TOML

    @property
    def state(self) -> Path:
        return self.path / ReportFile.STATE

    @property
    def lock(self) -> Path:
        return self.path / ReportFile.LOCK

    @property
    def report_json(self) -> Path:
        return self.path / ReportFile.JSON

    @property
    def rescorer_log(self) -> Path:
        return self.path / ReportFile.RESCORER_LOG

    @property
    def localize_reference_log(self) -> Path:
        return self.path / ReportFile.LOCALIZE_REFERENCE_LOG

    @property
    def golden_log(self) -> Path:
        return self.path / ReportFile.GOLDEN_LOG

    @property
    def golden(self) -> Path:
        return self.path / ReportFile.GOLDEN

    @property
    def speed(self) -> Path:
        return self.path / ReportFile.SPEED

    @property
    def diff(self) -> Path:
        return self.path / ReportFile.DIFF

    @property
    def summary(self) -> Path:
        return self.path / ReportFile.SUMMARY
