"""`strict-gate diff` as markdown (the console, $GITHUB_STEP_SUMMARY): a summary that stays short
for 10,000 prompts; diff.json (nightly/diff.py) holds every row."""

from __future__ import annotations

from strict_gate.judge.compare import Status
from strict_gate.nightly.diff import ReportDiff
from strict_gate.nightly.variants_diff import markdown_lines

ROWS_LISTED = 50  # rows per markdown table: a 10,000-prompt diff stays a summary (diff.json has all)
IDS_LISTED = 30  # prompt ids per markdown list


def _delta(a, b) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return ""
    return f"{b - a:+g}" if b != a else "="


def _ids(ids: tuple[str, ...]) -> str:
    from strict_gate.report.text import md

    return md(", ".join(ids[:IDS_LISTED])) + (" ..." if len(ids) > IDS_LISTED else "")


def _rows(rows: list[str], what: str) -> list[str]:
    """At most ROWS_LISTED table rows, then how many more there are and where they all are."""
    more = len(rows) - ROWS_LISTED
    tail = [f"… and {more} more {what}: diff.json lists every one."] if more > 0 else []
    return rows[:ROWS_LISTED] + [""] + tail + ([""] if tail else [])


def _figures(d: ReportDiff) -> list[str]:
    out = ["| measure | last night | tonight | change |", "|---|---|---|---|"]
    so, sn = d.old.summary, d.new.summary
    for key, label in (("prompts_exact", "prompts exact"), ("prompts_total", "prompts"),
                       ("positions_matched", "positions matched"), ("positions_total", "positions")):
        a, b = getattr(so, key), getattr(sn, key)
        out.append(f"| {label} | {a} | {b} | {_delta(a, b)} |")
    for status in (s for s in Status if s != Status.MATCH):
        a, b = so.counts.get(status, 0), sn.counts.get(status, 0)
        if a or b:
            out.append(f"| {status.value.replace('_', ' ')} | {a} | {b} | {_delta(a, b)} |")
    for key in ("gap_unknown", "later_divergent", "flipped_positions"):  # judge/tally.py's named flips
        a, b = (getattr(x.flips, key) if x.flips is not None else 0 for x in (so, sn))
        if a or b:
            out.append(f"| {key.replace('_', ' ')} | {a} | {b} | {_delta(a, b)} |")
    a, b = d.positions_common
    out.append(f"| positions matched, common prompts | {a} | {b} | {_delta(a, b)} |")
    return out + [""]


def _regressions(d: ReportDiff) -> list[str]:
    from strict_gate.report.text import md

    out = ["### Regressions", ""] if d.regressions else []
    for r in d.regressions:
        fails = "" if r.rule in d.fail_on else " (not in --fail-on: reported only)"
        ids = f": {_ids(r.prompts)}" if r.prompts else ""
        out.append(f"- **{r.rule.value}**{fails}: {md(r.detail)}{ids}")
    return out + ([""] if out else [])


def _changes(d: ReportDiff) -> list[str]:
    from strict_gate.report.text import md

    if not d.changes:
        return []
    rows = [f"| {md(c.id)} | {c.old_status} | {c.new_status} | {'yes' if c.old_passed else 'no'} -> "
            f"{'yes' if c.new_passed else 'no'} | {c.old_matched} -> {c.new_matched} |" for c in d.changes]
    head = ["### Prompts that changed", "", "| prompt | last night | tonight | passed | positions matched |",
            "|---|---|---|---|---|"]
    return head + _rows(rows, "prompts changed")


def _added_removed(d: ReportDiff) -> list[str]:
    if not (d.added or d.removed):
        return []
    out = ["### Prompts added or removed", ""]
    if d.added:
        failing = f" ({len(d.added_failing)} failing: {_ids(d.added_failing)})" if d.added_failing else ""
        out.append(f"- added {len(d.added)}: {_ids(d.added)}{failing}")
    if d.removed:
        out.append(f"- removed {len(d.removed)}: {_ids(d.removed)}")
    return out + [""]


def _setup(d: ReportDiff) -> list[str]:
    from strict_gate.report.text import md

    if not d.context:
        return []
    head = ["### What changed between the nights", "", "| what | last night | tonight |", "|---|---|---|"]
    return head + _rows([f"| {md(c.what)} | {md(str(c.old))} | {md(str(c.new))} |" for c in d.context], "changes")


def _drift_rows(d: ReportDiff) -> list[str]:
    from strict_gate.report.text import md

    if d.drift_note:
        return ["### Drift", "", md(d.drift_note), ""]
    return ["### Drift", "", "| total | last night | tonight | change |", "|---|---|---|---|"] + [
        f"| {md(x.metric)} | {x.old:.6g} | {x.new:.6g} | {x.new - x.old:+.3g}{' (worse)' if x.worse else ''} |"
        for x in d.drift] + [""]


def _variant_rows(d: ReportDiff) -> list[str]:
    return markdown_lines(d.variants)


def render_markdown(d: ReportDiff) -> str:
    """The diff for a reviewer (and $GITHUB_STEP_SUMMARY): the verdict line first, then the
    regressions; long lists are cut (diff.json has them whole), so 10,000 changed prompts
    still make a summary GitHub shows."""
    from strict_gate.report.text import md

    head = (f"REGRESSION ({', '.join(dict.fromkeys(r.rule.value for r in d.failing))})" if d.failing
            else "no regression")
    out = [f"## Night to night: {head}", ""]
    out.append(f"Last night: `{md(d.old.path)}` ({md(str(d.old.created))}, {md(str(d.old.verdict))}); "
               f"tonight: `{md(d.new.path)}` ({md(str(d.new.created))}, {md(str(d.new.verdict))}). "
               f"Fails on: {', '.join(r.value for r in d.fail_on) or 'nothing (report only)'}.")
    out.append("")
    for section in (_figures, _regressions, _changes, _added_removed, _setup, _variant_rows, _drift_rows):
        out += section(d)
    return "\n".join(out)
