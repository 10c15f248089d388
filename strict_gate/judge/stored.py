"""report.json read back: one typed reader for every report schema this tool writes.

`GateResult.to_json` (judge/result.py) writes a report; `diff`, `show`, `diagnose` and the
history read one through `load_report` alone. A report can be hand-edited, truncated, copied
from another version or written by a hostile tool, so each field a reader uses is declared
here with its type and decoded by msgspec: a wrong type, an unknown status or a schema this
version does not know is an InputError (exit 2) naming the file and the field, never a
traceback and never a silent guess. Fields no reader uses are not declared (and not read).

report@1 and report@2 differ in one field: report@1's `speed` held each arm's wall clock
(report@2 moved it to `wall_clock`), so a report@1 is read with no speed arm. report@3 holds
every feature's section in one mapping, `features` (name -> its verdict, exit code and figures,
judge/result.py's section_json), where report@2 kept `speed`, `invariance`, `drift` and `noise` at
the top level; both are read into the same StoredReport (`features`, and the typed fields the
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
from typing import Annotated, Any, Literal

import msgspec

from strict_gate.core.sections import field_error
from strict_gate.errors import ExitCode, InputError
from strict_gate.judge.cascade import Later
from strict_gate.judge.compare import Status
from strict_gate.judge.policy import Policy, VerdictKind
from strict_gate.judge.result import REPORT_SCHEMA
from strict_gate.judge.tally import Flips
from strict_gate.runs.layout import ReportDir

REPORT_V1 = "strict-gate/report@1"
REPORT_V2 = "strict-gate/report@2"
REPORT_SCHEMAS = (REPORT_V1, REPORT_V2, REPORT_SCHEMA)  # every version this reader accepts; any other is refused
HISTORY_SCHEMA = "strict-gate/history@1"

Count = Annotated[int, msgspec.Meta(ge=0)]
TokenId = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Struct(msgspec.Struct, frozen=True, kw_only=True):
    """Stored shapes are read-only values."""


class StoredRescored(_Struct, frozen=True):
    """One side's teacher-forced gap at a divergence (judge/compare.py's Rescored)."""

    gap: float | None = None
    why: str | None = None
    refutes: bool = False


class StoredDivergence(_Struct, frozen=True):
    position: Count | None = None
    reference_token: TokenId | None = None
    candidate_token: TokenId | None = None
    reference_gap: float | None = None
    candidate_gap: float | None = None
    reference_margin: float | None = None
    reason: str | None = None
    reference_top: list[tuple[TokenId, float]] | None = None
    candidate_top: list[tuple[TokenId, float]] | None = None
    reference_rescored: StoredRescored | None = None  # absent: not re-scored, or a report from before
    candidate_rescored: StoredRescored | None = None


class StoredLaterPosition(_Struct, frozen=True):
    position: Count
    token: TokenId
    reference_argmax: TokenId
    kind: Later
    reference_gap: float | None = None
    candidate_gap: float | None = None
    candidate_rescored: float | None = None
    reason: str = ""


class StoredCascade(_Struct, frozen=True):
    """A diagnosis' positions after the first divergence, judged (judge/cascade.py); absent before it existed."""

    first: Count
    end: Count
    outcome: Later
    later: Count = 0
    judged: Count = 0
    flips: Count = 0
    divergent: Count = 0
    worst_gap: float | None = None
    unverified_from: Count | None = None
    why: str | None = None
    summary: str = ""
    divergent_positions: list[StoredLaterPosition] = []


class StoredLaterTotals(_Struct, frozen=True):
    prompts_flipped: Count = 0
    later_positions: Count = 0
    judged: Count = 0
    later_flips: Count = 0
    later_divergent: Count = 0
    prompts_divergent_later: Count = 0
    unverified: Count = 0
    prompts_unverified: Count = 0


class StoredDiagnosis(_Struct, frozen=True):
    verdict: str | None = None
    error: str | None = None
    later: StoredCascade | None = None


class StoredPrompt(_Struct, frozen=True):
    id: str
    status: Status
    passed: bool = False
    outcome: Literal["pass", "fail", "unverified"] | None = None  # None: a report from before the every-token rule
    reason: str | None = None
    detail: str | None = None
    matched_positions: Count = 0
    first_divergence: StoredDivergence | None = None
    diagnosis: StoredDiagnosis | None = None
    localization: dict[str, Any] | None = None  # judge/localization.py reads it (Localization.from_json)


class StoredFlips(_Struct, frozen=True):
    """The headline's flips beside the status counts (judge/tally.py); absent before them."""

    divergent: Count = 0
    gap_unknown: Count = 0
    later_divergent: Count = 0
    prompts_later_divergent: Count = 0
    flipped_positions: Count = 0

    def flips(self) -> Flips:
        return Flips(self.divergent, self.gap_unknown, self.later_divergent, self.prompts_later_divergent,
                     self.flipped_positions)


class StoredSummary(_Struct, frozen=True):
    prompts_total: Count | None = None
    prompts_exact: Count | None = None
    positions_total: Count | None = None
    positions_matched: Count | None = None
    prefix_positions: Count | None = None
    counts: dict[Status, Count] = {}
    flips: StoredFlips | None = None


class StoredPromptSet(_Struct, frozen=True, omit_defaults=True):
    name: str | None = None
    sha256: str | None = None
    count: Count | None = None
    path: str | None = None
    ids: list[str] | None = None


class StoredEngineOptions(_Struct, frozen=True):
    replayed_from: str | None = None  # the baseline a recorded arm replays
    model_digest: str | None = None


class StoredEngine(_Struct, frozen=True):
    kind: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    options: StoredEngineOptions = msgspec.field(default_factory=StoredEngineOptions)
    versions: dict[str, Any] = {}  # as the engine said them: compared and printed, never parsed


class StoredEngines(_Struct, frozen=True):
    reference: StoredEngine = msgspec.field(default_factory=StoredEngine)
    candidate: StoredEngine = msgspec.field(default_factory=StoredEngine)


class StoredRuns(_Struct, frozen=True):
    reference: str | None = None
    candidate: str | None = None


class StoredConfig(_Struct, frozen=True):
    path: str | None = None
    base_dir: str | None = None


class StoredStats(_Struct, frozen=True, omit_defaults=True):
    mean: float | None = None
    p99: float | None = None
    max: float | None = None
    estimator: str | None = None  # kl only


class StoredPromptDrift(_Struct, frozen=True):
    id: str
    error: str | None = None
    positions: Count = 0
    same_top1: Count = 0
    abs_dlogprob: StoredStats = msgspec.field(default_factory=StoredStats)
    kl: StoredStats = msgspec.field(default_factory=StoredStats)
    min_reference_margin: float | None = None
    positions_within_band: Count = 0
    first_top1_difference: Count | None = None
    max_abs_dlogprob_before_divergence: float | None = None


class StoredDrift(_Struct, frozen=True):
    """report.json's `drift`: its totals (diff, history) and every figure `diagnose` keeps."""

    band: float | None = None
    top_logprobs: Count | None = None
    scored_by: str | None = None
    seconds: dict[str, float] = {}
    positions: Count | None = None
    same_top1: Count | None = None
    same_top1_rate: float | None = None
    abs_dlogprob: StoredStats | None = None
    kl: StoredStats | None = None
    min_reference_margin: float | None = None
    positions_within_band: Count | None = None
    prompts: dict[str, StoredPromptDrift] = {}


class StoredSection(_Struct, frozen=True):
    """One feature's section (report@3's `features`): its verdict, exit contribution and figures,
    read back by the feature's own loader (core/features.py) when a report is rewritten."""

    section: dict[str, Any]
    verdict: str | None = None  # None: a report@2 section, which did not say its verdict apart
    exit_code: Count | None = None


LEGACY_SECTIONS = ("speed", "invariance", "drift", "noise")  # report@2's top-level feature keys


class StoredReport(_Struct, frozen=True):
    """One gate's report.json as the readers use it."""

    schema: str
    prompts: list[StoredPrompt]
    name: str | None = None
    created: str | None = None
    verdict: VerdictKind | None = None
    exit_code: Count | None = None  # the gate's overall exit code (report@3)
    overall: str | None = None  # that exit code in words (report@3: "pass", "fail (invariance)", ...)
    policy: Policy | None = None
    band: float | None = None
    problems: list[str] = []
    summary: StoredSummary = msgspec.field(default_factory=StoredSummary)
    prompt_set: StoredPromptSet | None = None
    engines: StoredEngines = msgspec.field(default_factory=StoredEngines)
    runs: StoredRuns = msgspec.field(default_factory=StoredRuns)
    config: StoredConfig | None = None
    history: list[dict[str, Any]] = []  # history@1 lines, each checked by HistoryLine
    later: StoredLaterTotals | None = None  # None: a report from before the every-token rule
    features: dict[str, StoredSection] = {}  # every feature's section, by name (report@2's are lifted in)
    # the sections the readers use, typed; report@2 wrote them at the top level, report@3 under features
    speed: dict[str, Any] | None = None  # the speed arm; speed/view.py reads it field by field
    invariance: dict[str, Any] | None = None  # the [invariance] variants; nightly/variants_diff checks them
    drift: StoredDrift | None = None
    noise: dict[str, Any] | None = None


class _Part(_Struct, frozen=True):
    exact: Count | None = None
    matched: Count | None = None
    total: Count | None = None


class _NightArm(_Struct, frozen=True):
    kind: str | None = None
    model: str | None = None
    versions: dict[str, Any] = {}  # as the engine said them: compared and printed, never parsed
    baseline: str | None = None


class HistoryLine(_Struct, frozen=True):
    """One history@1 line (judge/history.py); report.json's `history` holds the same."""

    schema: str
    time: str | None = None
    gate: str | None = None
    verdict: VerdictKind | None = None
    prompts: _Part | None = None
    positions: _Part | None = None
    counts: dict[Status, Count] = {}
    reference: _NightArm | None = None
    candidate: _NightArm | None = None
    prompt_set_sha256: str | None = None
    commit: str | None = None
    report_dir: str | None = None
    drift: StoredDrift | None = None


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


def load_report(path: str | Path) -> StoredReport:
    """A report directory or its report.json, every field the readers use checked."""
    p = report_path(path)
    try:
        data = read_regular(p)
    except FileNotFoundError:
        raise InputError("no report here (expected a gate's report directory or its report.json)", path=str(p)) from None
    except OSError as e:
        raise InputError(f"cannot read the report: {e.strerror or e}", path=str(p)) from None
    return parse_report(data, str(p))


def parse_report(data: bytes, where: str) -> StoredReport:
    """report.json's bytes -> StoredReport; `where` names the file in every error."""
    try:
        head = msgspec.json.decode(data, type=_Schema)
    except msgspec.DecodeError as e:
        raise InputError(f"cannot read the report: not valid JSON ({e})", path=where, line=_json_line(data, e)) from None
    except msgspec.ValidationError:
        raise InputError('not a strict-gate report (no "schema": "strict-gate/report@N")', path=where) from None
    _check_schema(head.schema, where)
    try:
        report = msgspec.json.decode(data, type=StoredReport)
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
            msgspec.convert(body, StoredSection)
        except msgspec.ValidationError as e:
            return f"features.{name}: {field_error(e)}"
    return None


def report_of(obj: dict[str, Any], where: str = "report") -> StoredReport:
    """A report object in memory (GateResult.to_json) read the same way."""
    try:
        _check_schema(msgspec.convert(obj, _Schema).schema, where)
        return _checked(msgspec.convert(obj, StoredReport), where)
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


def _checked(report: StoredReport, where: str) -> StoredReport:
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
    if report.schema == REPORT_V1:  # its `speed` was each arm's wall clock, not a speed arm
        report = msgspec.structs.replace(report, speed=None)
    return _sections(report, where)


def _sections(report: StoredReport, where: str) -> StoredReport:
    """report@3: each section's exit code is one the CLI gives, and the typed fields are read from
    `features` (a top-level copy is not trusted); report@2: its top-level sections lifted into it."""
    if report.schema != REPORT_SCHEMA:
        legacy = {k: getattr(report, k) for k in LEGACY_SECTIONS if getattr(report, k) is not None}
        features = {k: StoredSection(section=v if isinstance(v, dict) else msgspec.to_builtins(v))
                    for k, v in legacy.items()}
        return msgspec.structs.replace(report, features=features)
    codes = {int(c) for c in ExitCode}
    for name, s in report.features.items():
        if s.exit_code is None or s.exit_code not in codes or s.verdict is None:
            raise InputError(f"cannot read the report: field features.{name}: a section needs a verdict and an "
                             f"exit code the CLI gives ({sorted(codes)})", path=where)
    body = {k: s.section for k, s in report.features.items() if k in LEGACY_SECTIONS}
    try:
        drift = msgspec.convert(body["drift"], StoredDrift) if "drift" in body else None
    except msgspec.ValidationError as e:
        raise InputError(f"cannot read the report: features.drift.section: {field_error(e)}", path=where) from None
    return msgspec.structs.replace(report, speed=body.get("speed"), invariance=body.get("invariance"),
                                   drift=drift, noise=body.get("noise"))


__all__ = ["REPORT_SCHEMAS", "HistoryLine", "StoredReport", "load_report", "parse_report", "report_of",
           "report_path"]
