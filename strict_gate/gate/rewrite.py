"""The one way a command rewrites a finished gate's reports: `strict-gate diagnose`,
`strict-gate localize`, and any later command that redoes part of a gate.

A command redoes what it is for (diagnose: the token verdict, re-scored; localize: the
localisation) and hands its new result here with the names of the sections it redid. Every other
section of the old report is read back through its feature's own loader (core/features.py) and
kept as the gate wrote it, with its verdict and exit contribution: a section this version cannot
read back, or whose figures no longer give the exit code it states, is refused (exit 2) instead of
dropped. So no rewrite loses a verdict, and the exit code can improve only through what was
judged again (the tokens, re-judged by every caller).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from strict_gate.core.features import entry, resolve
from strict_gate.core.redact import scrub_tree
from strict_gate.errors import InputError
from strict_gate.gate.outcome import GateOutcome
from strict_gate.gate.state import GateState, read_gate_state, record_verdicts, verdicts
from strict_gate.judge import restore
from strict_gate.judge.localization import Localization
from strict_gate.judge.result import FeatureResult, GateResult
from strict_gate.judge.schema import ReportDoc, SectionDoc
from strict_gate.runs.layout import ReportDir


def _load(name: str, stored: SectionDoc, where: str) -> FeatureResult:
    """A section of the old report, rebuilt by its feature's loader and checked against the verdict
    and exit code the report states for it."""
    feature = entry(name)
    if feature is None or feature.load is None:
        raise InputError(f"field features.{name}: a section this strict-gate cannot read back; rewriting the "
                         "report would lose it (use the strict-gate that wrote it)", path=where)
    try:
        section: FeatureResult = resolve(feature.load)(stored.section)
    except InputError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"field features.{name}.section: cannot be read back ({type(e).__name__}: {e})",
                         path=where) from None
    if stored.exit_code is not None and int(section.exit_code) != stored.exit_code:
        raise InputError(f"field features.{name}: it states exit code {stored.exit_code}, its figures give "
                         f"{int(section.exit_code)}: edited, or written by another version", path=where)
    return section


def _old_localization(old: ReportDoc, where: str) -> dict[str, Localization]:
    try:
        return {p.id: restore.localization(p.localization) for p in old.prompts if p.localization}
    except ValueError as e:
        raise InputError(f"a prompt's localization cannot be read back ({type(e).__name__}: {e})",
                         path=where) from None


def keep_sections(result: GateResult, old: ReportDoc, *, redone: Collection[str], where: str) -> GateResult:
    """`result` with every section of `old` it did not redo: each feature's section, each prompt's
    localisation (unless localize redid them; a prompt localised now replaces its old one) and the
    trend. `where` names report.json in every error."""
    features = dict(result.features)
    for name, stored in old.features.items():
        if name not in redone and name not in features:
            features[name] = _load(name, stored, where)
    localization = dict(result.localization)
    if "localize" not in redone:
        localization = {**_old_localization(old, where), **localization}
    return replace(result, features=features, localization=localization,
                   history=result.history or tuple(old.history))


def check_rewritable(report: ReportDir, old: ReportDoc, redone: Collection[str] = ()) -> GateState | None:
    """The gate state, when the gate left one, checked against report.json: every section whose
    verdict the gate sealed there is still in the report (a deleted section is not a kept pass),
    and the report states the exit code the gate recorded. A rewriting command calls it before it
    starts an engine too, so a report it would refuse costs no engine load."""
    if not report.state.exists():
        return None
    state = read_gate_state(report)
    lost = sorted(n for n in state.verdicts if n != "tokens" and n not in old.features and n not in redone)
    if lost:
        raise InputError(f"report.json has no {', '.join(lost)} section, though the gate recorded its verdict in "
                         f"{report.state.name} ({', '.join(f'{n} {state.verdicts[n]}' for n in lost)}): edited or "
                         "truncated; a rewrite would drop that verdict", path=str(report.report_json))
    if old.exit_code is not None and state.exit_code is not None and old.exit_code != state.exit_code:
        raise InputError(f"report.json states exit code {old.exit_code}, {report.state.name} recorded "
                         f"{state.exit_code}: edited, or from another run", path=str(report.report_json))
    return state


def rewrite_reports(report_dir: Path, result: GateResult, old: ReportDoc, *,
                    redone: Collection[str] = ()) -> GateOutcome:
    """Keep what the command did not redo, scrub what the engines wrote, write every report format
    (report.json last) and, where the gate left its state, seal the new verdicts and exit code into
    it, so `gate --resume` of the finished gate says what the reports say."""
    from strict_gate.report import write_reports
    from strict_gate.report.text import gate_decoder

    report = ReportDir(report_dir)
    state = check_rewritable(report, old, redone)
    result = keep_sections(result, old, redone=redone, where=str(report.report_json))
    scrub_tree(report_dir)  # what the engines logged, before the reports say the set is whole
    dec = gate_decoder(result)
    write_reports(result, report_dir, dec=dec)
    if state is not None:
        record_verdicts(report, state, verdicts(result), result.exit_code)
    return GateOutcome(result, report_dir, dec)


__all__ = ["check_rewritable", "keep_sections", "rewrite_reports"]
