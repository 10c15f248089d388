"""report.json read back: one typed reader for every report schema this tool writes.

report.json's shape is declared once, in judge/schema.py: the writer checks what it writes
against it and `diff`, `show`, `diagnose`, `localize` and the history read through it alone
(`load_report`). A report can be hand-edited, truncated, copied from another version or written
by a hostile tool, so it is decoded by msgspec into those shapes: a wrong type, an unknown
status or a schema this version does not know is an InputError (exit 2) naming the file and
the field, never a traceback and never a silent guess.

report@1 and report@2 differ in one field: report@1's `speed` held each arm's wall clock
(report@2 moved it to `wall_clock`), so a report@1 is read with no speed arm. report@3 holds
every feature's section in one mapping, `features` (name -> its verdict, exit code and figures,
judge/result.py's section_json), where report@2 kept `speed`, `invariance`, `drift` and `noise` at
the top level; both are read into the same ReportDoc (`features`, and the typed fields the
readers use).
Fields added to report@2 later are optional (a report without them reads as written before
them): each prompt's `outcome` and its diagnosis' `later` (every position after the first
divergence, judged), and the report's `later` totals.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import msgspec

from strict_gate.core.sections import field_error
from strict_gate.errors import ExitCode, InputError
from strict_gate.judge.result import REPORT_SCHEMA
from strict_gate.judge.schema import LEGACY_SECTIONS, DriftDoc, HistoryLine, ReportDoc, SectionDoc
from strict_gate.runs.layout import ReportDir

REPORT_V1 = "strict-gate/report@1"
REPORT_V2 = "strict-gate/report@2"
REPORT_SCHEMAS = (REPORT_V1, REPORT_V2, REPORT_SCHEMA)  # every version this reader accepts; any other is refused
HISTORY_SCHEMA = "strict-gate/history@1"


class _Schema(msgspec.Struct):
    schema: str


def _json_line(data: bytes, e: msgspec.DecodeError) -> int | None:
    m = re.search(r"\(byte (\d+)\)", str(e))
    return data.count(b"\n", 0, int(m.group(1))) + 1 if m else None


def open_regular(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """os.open that refuses anything but a regular file (a directory, a FIFO that would block a
    read for ever, a device) with an InputError naming the path. FileNotFoundError passes."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except IsADirectoryError:
        raise InputError("is a directory, not a file", path=str(path)) from None
    except FileNotFoundError:
        raise
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror or e}", path=str(path)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "not a file"
        raise InputError(f"is {what}, not a regular file", path=str(path))
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path) -> bytes:
    with open(open_regular(path), "rb") as f:
        return f.read()


def report_path(path: str | Path) -> Path:
    """A report directory or its report.json -> the report.json."""
    p = Path(path)
    return ReportDir(p).report_json if p.is_dir() else p


def load_report(path: str | Path) -> ReportDoc:
    """A report directory or its report.json, every field the readers use checked."""
    p = report_path(path)
    try:
        data = read_regular(p)
    except FileNotFoundError:
        raise InputError("no report here (expected a gate's report directory or its report.json)", path=str(p)) from None
    except OSError as e:
        raise InputError(f"cannot read the report: {e.strerror or e}", path=str(p)) from None
    return parse_report(data, str(p))


def parse_report(data: bytes, where: str) -> ReportDoc:
    """report.json's bytes -> ReportDoc; `where` names the file in every error."""
    try:
        head = msgspec.json.decode(data, type=_Schema)
    except msgspec.DecodeError as e:
        raise InputError(f"cannot read the report: not valid JSON ({e})", path=where, line=_json_line(data, e)) from None
    except msgspec.ValidationError:
        raise InputError('not a strict-gate report (no "schema": "strict-gate/report@N")', path=where) from None
    _check_schema(head.schema, where)
    try:
        report = msgspec.json.decode(data, type=ReportDoc)
    except msgspec.ValidationError as e:
        raw = msgspec.json.decode(data, type=_RawFeatures) if "$.features[" in str(e) else None
        raise InputError(f"cannot read the report: {_section_error(raw) or field_error(e)}", path=where) from None
    return _checked(report, where)


class _RawFeatures(msgspec.Struct):
    features: dict[str, Any] = {}


def _section_error(raw: _RawFeatures | None) -> str | None:
    """msgspec names a mapping's key as [...]: the section that does not read, by its name."""
    for name, body in (raw.features if raw is not None else {}).items():
        try:
            msgspec.convert(body, SectionDoc)
        except msgspec.ValidationError as e:
            return f"features.{name}: {field_error(e)}"
    return None


def report_of(obj: dict[str, Any], where: str = "report") -> ReportDoc:
    """A report object in memory (GateResult.to_json) read the same way."""
    try:
        _check_schema(msgspec.convert(obj, _Schema).schema, where)
        return _checked(msgspec.convert(obj, ReportDoc), where)
    except msgspec.ValidationError as e:
        raise InputError(f"cannot read the report: {field_error(e)}", path=where) from None


def _check_schema(schema: str, where: str) -> None:
    if schema not in REPORT_SCHEMAS:
        raise InputError(f"report schema {schema!r} is not one this strict-gate reads ({', '.join(REPORT_SCHEMAS)}): "
                         "a newer strict-gate wrote it, or it is not a report", path=where)


def history_line(obj: object) -> str | None:
    """Why `obj` is not a history line this version reads, or None when it is one."""
    if not isinstance(obj, dict):
        return f"not a JSON object ({type(obj).__name__})"
    schema = obj.get("schema")
    if schema != HISTORY_SCHEMA:
        return f"schema {schema!r} is not {HISTORY_SCHEMA!r}, the one this strict-gate reads"
    try:
        msgspec.convert(obj, HistoryLine)
    except msgspec.ValidationError as e:
        return field_error(e)
    return None


def _checked(report: ReportDoc, where: str) -> ReportDoc:
    """What types alone cannot say: one entry per prompt id, history lines of a known shape."""
    seen: set[str] = set()
    for i, p in enumerate(report.prompts):
        if p.id in seen:
            raise InputError(f"cannot read the report: field prompts[{i}].id: {p.id!r} appears twice", path=where)
        seen.add(p.id)
    for i, entry in enumerate(report.history):
        why = history_line(entry)
        if why is not None:
            raise InputError(f"cannot read the report: history[{i}]: {why}", path=where)
    for arm in ("reference", "candidate", "rescorer"):
        engine = getattr(report.engines, arm)
        try:
            if engine is not None:
                engine.known  # noqa: B018 (decoded here: a hostile option is exit 2 now, not a traceback later)
        except msgspec.ValidationError as e:
            raise InputError(f"cannot read the report: field engines.{arm}.options: {field_error(e)}", path=where) from None
    if report.schema == REPORT_V1:  # its `speed` was each arm's wall clock, not a speed arm
        report = msgspec.structs.replace(report, speed=None)
    return _sections(report, where)


def _sections(report: ReportDoc, where: str) -> ReportDoc:
    """report@3: each section's exit code is one the CLI gives, and the typed fields are read from
    `features` (a top-level copy is not trusted); report@2: its top-level sections lifted into it."""
    if report.schema != REPORT_SCHEMA:
        legacy = {k: getattr(report, k) for k in LEGACY_SECTIONS if getattr(report, k) is not None}
        features = {k: SectionDoc(section=v if isinstance(v, dict) else msgspec.to_builtins(v))
                    for k, v in legacy.items()}
        return msgspec.structs.replace(report, features=features)
    codes = {int(c) for c in ExitCode}
    for name, s in report.features.items():
        if s.exit_code is None or s.exit_code not in codes or s.verdict is None:
            raise InputError(f"cannot read the report: field features.{name}: a section needs a verdict and an "
                             f"exit code the CLI gives ({sorted(codes)})", path=where)
    body = {k: s.section for k, s in report.features.items() if k in LEGACY_SECTIONS}
    try:
        drift = msgspec.convert(body["drift"], DriftDoc) if "drift" in body else None
    except msgspec.ValidationError as e:
        raise InputError(f"cannot read the report: features.drift.section: {field_error(e)}", path=where) from None
    return msgspec.structs.replace(report, speed=body.get("speed"), invariance=body.get("invariance"),
                                   drift=drift, noise=body.get("noise"))


__all__ = ["REPORT_SCHEMAS", "HistoryLine", "ReportDoc", "load_report", "parse_report", "report_of",
           "report_path"]
