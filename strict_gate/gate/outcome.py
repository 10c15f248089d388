"""What the gate's phases share with the gate that runs them: the roles in running order, the
progress hook, the outcome, and the naming of a fresh report directory. Its own module, so that
gate/run.py imports the phases (bench, invariance, localize) and none of them imports run.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from strict_gate.gate.arm import OnRecord
from strict_gate.judge.result import GateResult
from strict_gate.runs.output import inside, safe_name

if TYPE_CHECKING:
    from strict_gate.report.text import Decoder

ProgressHook = Callable[[str, int], OnRecord]  # (arm label, prompt count) -> per-record callback
ROLES = ("candidate", "reference")  # in the order they run: one engine loaded at a time


@dataclass(frozen=True)
class GateOutcome:
    result: GateResult
    report_dir: Path
    # The decoder the reports were written with, for the job summary and console table to reuse:
    # one tokenizer load per gate.
    decoder: Decoder


def new_report_dir(output_dir: Path, name: str) -> Path:
    """A fresh directory for one gate's reports, named after the gate, always inside output_dir."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = output_dir / f"{safe_name(name)}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return inside(path, output_dir)
