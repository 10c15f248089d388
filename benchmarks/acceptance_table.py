"""The acceptance run's expectations (benchmarks/acceptance.toml) and the checks of one step.

Pure functions over a table, a report directory and a command's output; no process is started
here, so tests/test_acceptance.py checks the checker quickly. benchmarks/acceptance.py runs the
steps.

A step passes only when every expectation its row states holds: the exit code, no failure note
anywhere in its report files or its output (unless the row allows it and says why), the files it
must (and must not) leave, the text its output must show, and each headline figure within its
row's range. A step that could not run (an engine not installed, the report it follows missing)
is never a pass.
"""

from __future__ import annotations

import enum
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

# A row's figure: one value, or an inclusive [low, high] range (bf16 figures vary by machine).
Expected = float | tuple[float, float]
REF = re.compile(r"\{report:([A-Za-z0-9_.-]+)\}")
# keys of report.json/speed.json that hold an engine's text (prompt, continuation): never scanned
TEXT_KEYS = frozenset({"text", "prompt", "reference_text", "candidate_text", "tokens", "pieces", "continuation"})


class Rule(enum.Enum):
    """What holds on any x86 CPU where a figure moves with the CPU's bf16 or quantised kernels:
    the count of flips is the CPU's, the kind of every flip is not. A row states its rule, and its
    ranges are the documented spread over the machines measured, never one machine's number."""
    NEAR_TIES_ONLY = "near-ties-only"  # every prompt exact or a near-tie: none divergent, errored or missing,
    # and no position after a near-tie divergent (report.json's later totals: a first flip alone is not every flip)
    NEAR_TIES_LOCALISED = "near-ties-localised"  # that, and each near-tie localised without an error

    def unmet(self, got: dict[str, float]) -> list[str]:
        """The rule's clauses the report's figures break (a figure absent breaks its clause)."""
        g = {k: got.get(k) for k in ("prompts_exact", "prompts_total", "near_tie", "divergent", "error", "missing",
                                     "later_divergent", "localised", "not_localised")}
        out = [f"rule {self.value}: {k} = {_show(g[k])}, expected 0"
               for k in ("divergent", "error", "missing", "later_divergent") if g[k] != 0]
        if None in (g["prompts_exact"], g["near_tie"], g["prompts_total"]) or \
                g["prompts_exact"] + g["near_tie"] != g["prompts_total"]:  # type: ignore[operator]
            out.append(f"rule {self.value}: prompts_exact {_show(g['prompts_exact'])} + near_tie "
                       f"{_show(g['near_tie'])} is not prompts_total {_show(g['prompts_total'])}: a flip is not a near-tie")
        if self is Rule.NEAR_TIES_LOCALISED and (g["localised"] != g["near_tie"] or g["not_localised"] != 0):
            out.append(f"rule {self.value}: localised {_show(g['localised'])} of {_show(g['near_tie'])} near-ties, "
                       f"{_show(g['not_localised'])} not localised")
        return out


def _show(v: float | None) -> str:
    return "absent" if v is None else f"{v:g}"


class TableError(Exception):
    """The expectations table is malformed; the message names the file and the row."""


class Scan(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    patterns: tuple[str, ...]  # regexes (case-insensitive) of a phase's failure note


class Step(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    id: str
    tier: Literal["fast", "full", "capture"]  # capture: the real reference's K = 5 re-capture (an hour each)
    command: str  # as a user types it, from the repository root; "{report:ID}" = step ID's report
    exit: int  # the documented exit code; -9: the step SIGKILLs the gate itself (kill_at_records)
    why: str = ""  # what the row shows
    needs: tuple[str, ...] = ()  # paths the step needs (an engine's venv, a built binary, ~/.cache/...)
    report_in: str = "reports"  # the directory its new report directory appears in
    report: str = ""  # else its report directory exactly: "{report:ID}" or a path
    figures: dict[str, Expected] = {}
    figures_why: str = ""  # required when a figure is a range: why it may move
    rule: Rule | None = None  # what must hold whatever the CPU (near-ties-only, near-ties-localised)
    allow: tuple[str, ...] = ()  # failure notes this step may show (regexes)
    allow_why: str = ""  # required with allow
    files: tuple[str, ...] = ()  # must exist in the report directory
    absent: tuple[str, ...] = ()  # must not exist there (nothing half-written reads as complete)
    output: tuple[str, ...] = ()  # regexes the command's output must contain
    covers: tuple[str, ...] = ()  # gate files the command runs without naming them (`gate` alone: the demo)
    kill_at_records: int = 0  # SIGKILL the command once its run has this many records
    timeout_s: int = 1800

    def depends_on(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(REF.findall(self.command) + REF.findall(self.report)))


class Table(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    scan: Scan
    step: tuple[Step, ...]


def load_table(path: Path) -> Table:
    """Read and validate the table; every problem is a TableError naming the file and the row."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TableError(f"{path}: {e}") from None
    try:
        table = msgspec.convert(raw, Table)
    except msgspec.ValidationError as e:
        raise TableError(f"{path}: {e}") from None
    for pattern in table.scan.patterns:
        _compile(path, "scan", pattern)
    seen: set[str] = set()
    for step in table.step:
        _check_row(path, step, seen)
        seen.add(step.id)
    return table


def _check_row(path: Path, step: Step, earlier: set[str]) -> None:
    where = f"{path}: step {step.id!r}"
    if step.id in earlier:
        raise TableError(f"{where}: the id is used twice")
    for dep in step.depends_on():
        if dep not in earlier:
            raise TableError(f"{where}: {{report:{dep}}} names no earlier step")
    if not step.command.startswith("strict-gate "):
        raise TableError(f"{where}: command must start with 'strict-gate ' (as a user types it)")
    if step.allow and not step.allow_why:
        raise TableError(f"{where}: allow without allow_why (say why the note is expected)")
    if any(isinstance(v, tuple) and v[0] != v[1] for v in step.figures.values()) and not step.figures_why:
        raise TableError(f"{where}: a figure is a range but figures_why does not say why it may move")
    for name, value in step.figures.items():
        if isinstance(value, tuple) and value[0] > value[1]:
            raise TableError(f"{where}: figure {name!r} range [{value[0]}, {value[1]}] is empty")
    if (step.exit == -9) != (step.kill_at_records > 0):
        raise TableError(f"{where}: exit -9 (killed) goes with kill_at_records, and only with it")
    for pattern in (*step.allow, *step.output):
        _compile(path, step.id, pattern)


def _compile(path: Path, row: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise TableError(f"{path}: {row}: bad regex {pattern!r}: {e}") from None


def select(table: Table, tier: str, only: tuple[str, ...] = ()) -> tuple[Step, ...]:
    """The steps of a tier ("fast": the fast rows; "full": every gate and follow-up; "all": the
    re-captures of the real model's reference too), or the named ones, each with the steps it
    follows (a localize needs its gate)."""
    by_id = {s.id: s for s in table.step}
    unknown = [i for i in only if i not in by_id]
    if unknown:
        raise TableError(f"no step named {', '.join(unknown)}")
    tiers = {"fast": ("fast",), "full": ("fast", "full"), "all": ("fast", "full", "capture")}[tier]
    wanted = set(only) if only else {s.id for s in table.step if s.tier in tiers}
    todo = list(wanted)
    while todo:
        for dep in by_id[todo.pop()].depends_on():
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return tuple(s for s in table.step if s.id in wanted)


def uncovered_gates(gate_files: list[str], steps: tuple[Step, ...]) -> list[str]:
    """Shipped gates no row runs: each is an unmet expectation (a new gate gets its row)."""
    named = " ".join(s.command for s in steps)
    covered = {g for s in steps for g in s.covers}
    return [g for g in gate_files if g not in covered and not re.search(rf"(^|\s){re.escape(g)}(\s|$)", named)]


@dataclass(frozen=True)
class Outcome:
    """What one step did: its exit code, its output, the report directory it wrote or acted on."""
    exit: int | None  # None: it did not run (see skipped)
    output: str
    report_dir: Path | None
    seconds: float
    skipped: str = ""  # why it did not run
    cpu_s: float = 0.0  # CPU seconds of its processes (those reaped)


def failure_notes(report_dir: Path | None, output: str, patterns: tuple[str, ...]) -> list[str]:
    """Every failure note a step left: an `error` in a report file, a note matching a failure
    pattern in a report file (.json, .md directly in the report directory) or in the output."""
    regex = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)
    notes = [f"output: {line.strip()}" for line in output.splitlines() if regex.search(line)]
    if report_dir is None or not report_dir.is_dir():
        return notes
    for f in sorted(report_dir.iterdir()):
        if f.suffix == ".json" and f.is_file():
            try:
                doc = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                notes.append(f"{f.name}: unreadable: {e}")
                continue
            notes += [f"{f.name}: {where}: {text}" for where, text in _json_notes(doc, regex, "")]
        elif f.suffix == ".md" and f.is_file():
            notes += [f"{f.name}: {line.strip()}" for line in f.read_text(encoding="utf-8").splitlines()
                      if regex.search(line)]
    return notes


def _json_notes(doc: object, regex: re.Pattern[str], where: str) -> list[tuple[str, str]]:
    if isinstance(doc, dict):
        out: list[tuple[str, str]] = []
        for key, value in doc.items():
            if key in TEXT_KEYS:
                continue
            path = f"{where}.{key}" if where else str(key)
            if key in ("error", "errors") and value:
                out.append((path, _short(value)))
            else:
                out += _json_notes(value, regex, path)
        return out
    if isinstance(doc, list):
        return [n for i, v in enumerate(doc) for n in _json_notes(v, regex, f"{where}[{i}]")]
    if isinstance(doc, str) and regex.search(doc):
        return [(where, _short(doc))]
    return []


def _short(value: object, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def figures(report_dir: Path | None) -> dict[str, float]:
    """The headline figures of a report directory: report.json's summary, its later divergent
    positions (after each prompt's first flip) and its localisation counts; any other figure a
    row names is read as FILE:dotted.path."""
    doc = _read_json(report_dir, "report.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
        return {}
    s, counts = doc["summary"], doc["summary"].get("counts", {})
    out = {"prompts_exact": s.get("prompts_exact"), "prompts_total": s.get("prompts_total"),
           "positions_matched": s.get("positions_matched"), **{k: v for k, v in counts.items()}}
    later = doc.get("later")
    out["later_divergent"] = later.get("later_divergent") if isinstance(later, dict) else None
    locs = [p.get("localization") for p in doc.get("prompts", []) if isinstance(p, dict)]
    out["localised"] = sum(1 for x in locs if isinstance(x, dict) and not x.get("error"))
    out["not_localised"] = sum(1 for x in locs if isinstance(x, dict) and x.get("error"))
    return {k: float(v) for k, v in out.items() if isinstance(v, int | float)}


def figure(report_dir: Path | None, name: str, named: dict[str, float]) -> float | None:
    if ":" not in name:
        return named.get(name)
    file, _, dotted = name.partition(":")
    value: object = _read_json(report_dir, file)
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else (
            value[int(key)] if isinstance(value, list) and key.isdigit() and int(key) < len(value) else None)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, list | dict):
        return float(len(value))  # a list or object's figure is its length (e.g. rungs measured)
    return float(value) if isinstance(value, int | float) else None


def _read_json(report_dir: Path | None, name: str) -> object:
    if report_dir is None:
        return None
    try:
        return json.loads((report_dir / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check(step: Step, outcome: Outcome, patterns: tuple[str, ...]) -> list[str]:
    """Every expectation of the row that the outcome does not meet (empty: the step passed)."""
    if outcome.skipped:
        return [f"not run: {outcome.skipped}"]
    unmet = []
    if outcome.exit != step.exit:
        unmet.append(f"exit {outcome.exit}, expected {step.exit}")
    allowed = [re.compile(p, re.IGNORECASE) for p in step.allow]
    for note in failure_notes(outcome.report_dir, outcome.output, patterns):
        if not any(a.search(note) for a in allowed):
            unmet.append(f"failure note: {note}")
    if step.files or step.absent or step.figures:
        if outcome.report_dir is None:
            unmet.append("no report directory found")
        else:
            unmet += [f"{f} is missing" for f in step.files if not (outcome.report_dir / f).exists()]
            unmet += [f"{f} exists (expected absent)" for f in step.absent if (outcome.report_dir / f).exists()]
    unmet += [f"output lacks /{p}/" for p in step.output if not re.search(p, outcome.output, re.IGNORECASE)]
    named = figures(outcome.report_dir)
    if step.rule is not None:
        unmet += step.rule.unmet(named)
    for name, want in step.figures.items():
        got = figure(outcome.report_dir, name, named)
        low, high = want if isinstance(want, tuple) else (want, want)
        if got is None:
            unmet.append(f"{name}: not found in the report")
        elif not low <= got <= high:
            unmet.append(f"{name} = {got:g}, expected {_fmt(want)}")
    return unmet


def _fmt(want: Expected) -> str:
    if isinstance(want, tuple):
        return f"{want[0]:g}" if want[0] == want[1] else f"{want[0]:g}-{want[1]:g}"
    return f"{want:g}"


def show_figures(step: Step, outcome: Outcome) -> str:
    """The row's figures as measured, for the table: name=value (expected)."""
    named = figures(outcome.report_dir)
    parts = []
    for name, want in step.figures.items():
        got = figure(outcome.report_dir, name, named)
        parts.append(f"{name.split(':')[-1]} {'-' if got is None else f'{got:g}'} ({_fmt(want)})")
    return ", ".join(parts)
