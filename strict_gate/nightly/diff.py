"""Night to night: what changed between two gate reports, and whether it is a regression.

Reads two report.json files through judge/stored.py (no engine, no torch): prompts that started or stopped matching,
status changes, the positions-matched delta over the prompts both nights ran, prompts added or
removed, changes of engine, model, versions, baseline or prompt set, and the drift totals when
both reports carry them. Which changes fail the job is the caller's choice (`fail_on`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from strict_gate.core.options import did_you_mean
from strict_gate.errors import ConfigError, ExitCode, InputError
from strict_gate.judge.compare import Status
from strict_gate.judge.history import drift_totals
from strict_gate.judge.schema import ReportDoc, SummaryDoc
from strict_gate.judge.stored import load_report, report_of, report_path
from strict_gate.nightly.variants_diff import VariantChange, variant_changes

DIFF_SCHEMA = "strict-gate/diff@1"


class Rule(StrEnum):
    """A kind of regression; `--fail-on` lists the ones that fail the job."""

    NEW_FAILURE = "new-failure"  # a prompt that passed fails now (or a new prompt fails)
    STATUS_WORSE = "status-worse"  # a prompt's status moved down the ladder (SEVERITY)
    POSITIONS_DROP = "positions-drop"  # fewer positions matched over the prompts both nights ran
    DRIFT_WORSE = "drift-worse"  # a drift total moved the wrong way (both nights have drift)
    VARIANT_MOVED = "variant-moved"  # an [invariance] variant holds fewer prompts than last night


DEFAULT_FAIL_ON = (Rule.NEW_FAILURE, Rule.STATUS_WORSE, Rule.POSITIONS_DROP)

# match < near_tie < divergent = length_mismatch < not_greedy = tokenization_mismatch < missing = error
SEVERITY = {
    Status.MATCH: 0, Status.NEAR_TIE: 1, Status.DIVERGENT: 2, Status.LENGTH_MISMATCH: 2,
    Status.NOT_GREEDY: 3, Status.TOKENIZATION_MISMATCH: 3, Status.MISSING: 4, Status.ERROR: 4,
}

# drift total -> +1 when a larger value is better, -1 when smaller is better
DRIFT_METRICS = {
    "same_top1_rate": +1, "abs_dlogprob.mean": -1, "abs_dlogprob.p99": -1, "abs_dlogprob.max": -1,
    "kl.mean": -1, "min_reference_margin": +1, "within_band_rate": +1,
}


def parse_fail_on(text: str) -> tuple[Rule, ...]:
    """'new-failure,status-worse' -> rules; '' or 'none' -> no rule (report only)."""
    names = [t.strip() for t in text.split(",") if t.strip() and t.strip() != "none"]
    known = [r.value for r in Rule]
    for n in names:
        if n not in known:
            raise ConfigError(f"--fail-on: unknown rule {n!r}{did_you_mean(n, known)} (known: {', '.join(known)})")
    return tuple(Rule(n) for n in dict.fromkeys(names))


@dataclass(frozen=True)
class PromptChange:
    id: str
    old_status: Status
    new_status: Status
    old_passed: bool
    new_passed: bool
    old_matched: int
    new_matched: int

    @property
    def worse(self) -> bool:
        return SEVERITY[self.new_status] > SEVERITY[self.old_status]


@dataclass(frozen=True)
class ContextChange:
    """Something about the setup that differs between the nights (not itself a regression)."""

    what: str
    old: Any
    new: Any


@dataclass(frozen=True)
class DriftChange:
    metric: str
    old: float
    new: float
    worse: bool


@dataclass(frozen=True)
class Regression:
    rule: Rule
    detail: str
    prompts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Night:
    path: str
    name: str | None
    created: str | None
    verdict: str | None
    summary: SummaryDoc


@dataclass(frozen=True)
class ReportDiff:
    old: Night
    new: Night
    changes: tuple[PromptChange, ...]  # prompts in both nights whose status, verdict or positions moved
    added: tuple[str, ...]
    removed: tuple[str, ...]
    added_failing: tuple[str, ...]
    positions_common: tuple[int, int]  # positions matched over the common prompts, (old, new)
    context: tuple[ContextChange, ...]
    drift: tuple[DriftChange, ...]
    drift_note: str | None  # why there is no drift comparison
    regressions: tuple[Regression, ...]  # every regression found, failing or not
    fail_on: tuple[Rule, ...]
    variants: tuple[VariantChange, ...] = ()  # [invariance] variants whose figures changed

    @property
    def failing(self) -> tuple[Regression, ...]:
        return tuple(r for r in self.regressions if r.rule in self.fail_on)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAIL if self.failing else ExitCode.PASS

    @property
    def started_matching(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.changes if c.new_status == Status.MATCH != c.old_status)

    @property
    def stopped_matching(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.changes if c.old_status == Status.MATCH != c.new_status)


def _night(path: Path, r: ReportDoc) -> Night:
    return Night(str(path), r.name, r.created, None if r.verdict is None else r.verdict.value, r.summary)


def _context(old: ReportDoc, new: ReportDoc) -> tuple[ContextChange, ...]:
    out = []

    def check(what: str, a, b) -> None:
        if a != b:
            out.append(ContextChange(what, a, b))

    check("gate", old.name, new.name)
    check("prompt set sha256", old.prompt_set and old.prompt_set.sha256, new.prompt_set and new.prompt_set.sha256)
    check("policy", old.policy, new.policy)
    for arm in ("reference", "candidate"):
        a, b = getattr(old.engines, arm), getattr(new.engines, arm)
        check(f"{arm} kind", a.kind, b.kind)
        check(f"{arm} model", a.model, b.model)
        check(f"{arm} baseline", a.known.replayed_from, b.known.replayed_from)
        check(f"{arm} model digest", a.known.model_digest, b.known.model_digest)
        for lib in sorted(set(a.versions) | set(b.versions)):
            check(f"{arm} {lib} version", a.versions.get(lib), b.versions.get(lib))
    return tuple(out)


def _flat_drift(totals: dict) -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in totals.items():
        if isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[key] = value
    if flat.get("positions") and "positions_within_band" in flat:
        flat["within_band_rate"] = flat["positions_within_band"] / flat["positions"]
    return flat


def _drift(old: ReportDoc, new: ReportDoc) -> tuple[tuple[DriftChange, ...], str | None]:
    a, b = drift_totals(old.drift), drift_totals(new.drift)
    if a is None or b is None:
        which = "neither night has" if a is None and b is None else ("last night has no" if a is None else "tonight has no")
        return (), f"{which} drift figures (report.json \"drift\"): no drift comparison"
    fa, fb = _flat_drift(a), _flat_drift(b)
    changes = tuple(
        DriftChange(m, fa[m], fb[m], (fb[m] - fa[m]) * sign < 0)
        for m, sign in DRIFT_METRICS.items() if m in fa and m in fb
    )
    return changes, None


def _stored(r: ReportDoc | Mapping[str, Any], where: str) -> ReportDoc:
    return r if isinstance(r, ReportDoc) else report_of(dict(r), where)


def diff_reports(old: ReportDoc | Mapping[str, Any], new: ReportDoc | Mapping[str, Any], *,
                 fail_on=DEFAULT_FAIL_ON, old_path="old", new_path="new") -> ReportDiff:
    """Compare two reports, last night's first: StoredReports, or report objects as json.load
    gives them (checked by the same reader)."""
    old, new = _stored(old, old_path), _stored(new, new_path)
    po = {p.id: p for p in old.prompts}
    pn = {p.id: p for p in new.prompts}
    changes = []
    for pid in (i for i in pn if i in po):
        a, b = po[pid], pn[pid]
        c = PromptChange(pid, a.status, b.status, a.passed, b.passed, a.matched_positions, b.matched_positions)
        if (c.old_status, c.old_passed, c.old_matched) != (c.new_status, c.new_passed, c.new_matched):
            changes.append(c)
    added = tuple(i for i in pn if i not in po)
    removed = tuple(i for i in po if i not in pn)
    added_failing = tuple(i for i in added if not pn[i].passed)
    common = [i for i in pn if i in po]
    positions = (sum(po[i].matched_positions for i in common), sum(pn[i].matched_positions for i in common))
    drift, drift_note = _drift(old, new)

    regressions = []
    newly_failing = tuple(c.id for c in changes if c.old_passed and not c.new_passed) + added_failing
    if newly_failing:
        regressions.append(Regression(Rule.NEW_FAILURE, f"{len(newly_failing)} prompt(s) fail that did not",
                                      newly_failing))
    worse = [c for c in changes if c.worse]
    if worse:
        regressions.append(Regression(Rule.STATUS_WORSE, f"{len(worse)} prompt(s) moved to a worse status",
                                      tuple(c.id for c in worse)))
    if positions[1] < positions[0]:
        dropped = tuple(c.id for c in changes if c.new_matched < c.old_matched)
        regressions.append(Regression(
            Rule.POSITIONS_DROP,
            f"positions matched over the {len(common)} common prompts fell from {positions[0]} to {positions[1]}",
            dropped))
    variants = variant_changes({"invariance": old.invariance}, {"invariance": new.invariance},
                               old_path=old_path, new_path=new_path)
    if moved := [v.label for v in variants if v.started_moving]:
        regressions.append(Regression(Rule.VARIANT_MOVED, f"invariance variant(s) started to move: {', '.join(moved)}"))
    if any(d.worse for d in drift):
        regressions.append(Regression(Rule.DRIFT_WORSE, ", ".join(
            f"{d.metric} {d.old:.6g} → {d.new:.6g}" for d in drift if d.worse)))
    return ReportDiff(
        old=_night(Path(old_path), old), new=_night(Path(new_path), new), changes=tuple(changes),
        added=added, removed=removed, added_failing=added_failing, positions_common=positions,
        context=_context(old, new), drift=drift, drift_note=drift_note, regressions=tuple(regressions),
        fail_on=tuple(fail_on), variants=variants,
    )


def diff_report_files(old: str | Path, new: str | Path, *, fail_on=DEFAULT_FAIL_ON) -> ReportDiff:
    """Diff two report directories (or report.json files), last night's first."""
    return diff_reports(load_report(old), load_report(new), fail_on=fail_on,
                        old_path=str(report_path(old)), new_path=str(report_path(new)))


def _night_json(n: Night) -> dict:
    return {"path": n.path, "name": n.name, "created": n.created, "verdict": n.verdict,
            "summary": msgspec.to_builtins(n.summary)}


def to_json(d: ReportDiff) -> dict:
    """diff.json (strict-gate/diff@1)."""
    return {
        "schema": DIFF_SCHEMA,
        "old": _night_json(d.old),
        "new": _night_json(d.new),
        "regression": bool(d.failing),
        "fail_on": [r.value for r in d.fail_on],
        "regressions": [{"rule": r.rule.value, "detail": r.detail, "prompts": list(r.prompts),
                         "fails": r.rule in d.fail_on} for r in d.regressions],
        "started_matching": list(d.started_matching),
        "stopped_matching": list(d.stopped_matching),
        "changes": [{"id": c.id, "old_status": c.old_status.value, "new_status": c.new_status.value,
                     "old_passed": c.old_passed, "new_passed": c.new_passed,
                     "old_matched_positions": c.old_matched, "new_matched_positions": c.new_matched}
                    for c in d.changes],
        "added": list(d.added),
        "removed": list(d.removed),
        "positions_matched_common": {"old": d.positions_common[0], "new": d.positions_common[1],
                                     "delta": d.positions_common[1] - d.positions_common[0]},
        "context": [{"what": c.what, "old": c.old, "new": c.new} for c in d.context],
        "drift": [{"metric": x.metric, "old": x.old, "new": x.new, "worse": x.worse} for x in d.drift],
        "drift_note": d.drift_note,
        "invariance": [v.to_json() for v in d.variants],
    }


def write_diff_json(d: ReportDiff, path: str | Path) -> Path:
    """diff.json, strict JSON, written atomically."""
    from strict_gate.report.text import strict_json
    from strict_gate.runs.records import write_text_atomic

    path = Path(path)
    try:
        write_text_atomic(path, json.dumps(strict_json(to_json(d)), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    except OSError as e:
        raise InputError(f"cannot write the diff: {e.strerror or e}", path=str(path)) from None
    return path
