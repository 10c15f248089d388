"""`strict-gate golden GATE.toml`: the oracle checked on its own against the golden, before a
nightly trusts it. The reference arm runs (a recorded baseline is replayed), every record's
greedy tokens are teacher-forced through the golden on the reference's own prefix, and the
check is written beside the run as golden.json, sealed to the reference's records (a file
edited or copied beside another run is refused by `read_check`), and as golden.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import msgspec

from strict_gate.core.engine_log import engine_log
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.arm import prompt_inputs, run_arm
from strict_gate.gate.config import GateConfig
from strict_gate.gate.judgement import gate_spec
from strict_gate.gate.outcome import ProgressHook, new_report_dir
from strict_gate.golden.config import of
from strict_gate.golden.load import HealthShape, read_health
from strict_gate.golden.result import HealthCheck, health_json
from strict_gate.golden.run import check_reference, started
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.records import write_json_atomic, write_text_atomic

SCHEMA = "strict-gate/golden-check@1"


@dataclass(frozen=True)
class CheckOutcome:
    health: HealthCheck
    report_dir: Path
    golden: str  # the golden as one line: kind, model, dtype


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: str
    records_sha256: str  # the reference's records.jsonl this check belongs to
    golden: str
    health: HealthShape
    digest: str


def _digest(records_sha256: str, golden: str, health: dict) -> str:
    body = json.dumps({"schema": SCHEMA, "records_sha256": records_sha256, "golden": golden, "health": health},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _records_sha256(report: ReportDir) -> str:
    return hashlib.sha256(report.arm("reference").records.read_bytes()).hexdigest()


def write_check(report: ReportDir, health: HealthCheck, golden: str) -> None:
    """golden.json, sealed to the reference's records, and golden.md beside it."""
    sha, body = _records_sha256(report), health_json(health)
    write_json_atomic(report.golden, {"schema": SCHEMA, "records_sha256": sha, "golden": golden, "health": body,
                                      "digest": _digest(sha, golden, body)})
    write_text_atomic(report.path / "golden.md", "\n".join(check_lines(health, golden)) + "\n")


def read_check(report_dir: Path) -> HealthCheck:
    """A sealed golden.json back; InputError when it is not the check of the run beside it."""
    report = ReportDir(report_dir)
    try:
        f = msgspec.json.decode(report.golden.read_bytes(), type=_File)
        sha = _records_sha256(report)
    except (OSError, msgspec.DecodeError) as e:
        raise InputError(f"not a readable golden check: {e}", path=str(report.golden)) from None
    if f.schema != SCHEMA:
        raise InputError(f"schema {f.schema!r}, not {SCHEMA!r}", path=str(report.golden))
    if f.records_sha256 != sha or f.digest != _digest(sha, f.golden, msgspec.to_builtins(f.health)):
        raise InputError("it does not match its digest or the reference's records beside it (edited, or copied "
                         "from another run)", path=str(report.golden))
    return read_health(f.health)


def check_lines(health: HealthCheck, golden: str) -> list[str]:
    """The check as the command prints it and golden.md holds it."""
    out = [f"golden check of the reference against {golden}: {health.line()}"]
    for p in health.prompts:
        pid, d = p.id, p.check
        if p.error is not None:
            out.append(f"  {pid}: not checked: {p.error}")
        elif d is not None and d.first is not None:
            gaps = ", ".join("outside top-k" if g is None else f"{g:.4g}" for g in d.gaps[:5])
            out.append(f"  {pid}: off the golden's argmax from position {d.first}, at {len(d.gaps)} of "
                       f"{d.positions} positions (gaps {gaps}{', ...' if len(d.gaps) > 5 else ''})")
    return out


def golden_check(cfg: GateConfig, *, output_dir: Path | None = None,
                 progress: ProgressHook | None = None) -> CheckOutcome:
    """Run the reference arm into a fresh report directory, check it against the golden, seal it."""
    gc = of(cfg)
    if gc is None:
        raise ConfigError("the config has no [golden] table to check the reference against", path=cfg.path)
    ps = load_prompts(cfg.prompts)
    spec = gate_spec(cfg, ps)
    reference = cfg.reference.build()
    report = ReportDir(new_report_dir(output_dir or cfg.output_dir, f"{cfg.name}-golden"))
    log = report.arm("reference").engine_log
    with engine_log(log, reference.log_libraries):
        try:
            inputs = prompt_inputs(ps, reference)
            on_record = progress("reference", len(inputs)) if progress else None
            run = run_arm(reference, inputs, spec.sampling, report.arm("reference").path, prompt_set=ps,
                          on_record=on_record)
        finally:
            reference.close()
    golden = gc.arm.build()
    golden.set_log_path(report.golden_log)
    with engine_log(report.golden_log, golden.log_libraries):
        try:
            why = started(golden)
            health = check_reference(golden, run.records, list(ps.ids), spec.band, why)
        finally:
            golden.close()
    words = f"{gc.arm.kind} {getattr(gc.arm.options, 'model', '?')} ({getattr(gc.arm.options, 'dtype', '?')})"
    write_check(report, health, words)
    return CheckOutcome(health, report.path, words)
