"""Report outputs before and after a change, gate by gate: which files are byte-identical once
what moves run to run (timestamps, seconds, tokens per second, report directory names, process
ids) is masked, and the lines that differ otherwise.

Two acceptance copies (`bash scripts/acceptance.sh --tier fast --rev OLD --keep`, then the same
at HEAD) hold one report directory per gate step; this pairs them by gate name (the directory
name without its timestamp) and compares report.md, report.html and junit.xml.

    .venv/bin/python benchmarks/report_bytes.py OLD_COPY NEW_COPY [--out FILE.md]
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path

FILES = ("report.md", "report.html", "junit.xml")
STAMP = re.compile(r"-\d{8}-\d{6}(-\d+)?$")
MASKS = (
    (re.compile(r"\d{8}-\d{6}(-\d+)?"), "<stamp>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(r"\d+(\.\d+)?(e[+-]?\d+)?( ?(s|ms|tok/s|x)\b)"), r"<n>\3"),
    (re.compile(r'(time|timestamp)="[^"]*"'), r'\1="<n>"'),
    (re.compile(r"pid \d+"), "pid <n>"),
    (re.compile(r"/tmp/[\w.-]+"), "<tmp>"),
    # the wall-clock table's rows: seconds, tokens per second, median TTFT (report.md)
    (re.compile(r"^\| (reference|candidate|rescorer) \| (\d+) \| (\d+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$"),
     r"| \1 | \2 | \3 | <n> | <n> | <n> |"),
)


def masked(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        for pattern, repl in MASKS:
            line = pattern.sub(repl, line)
        out.append(line)
    return out


def reports(root: Path) -> dict[str, Path]:
    """gate name -> its report directory (the last one of that name: a nightly's second night)."""
    found = {}
    for d in sorted(p.parent for p in root.glob("*reports/*/report.json")):
        found[STAMP.sub("", d.name) + ("" if d.parent.name == "reports" else f" ({d.parent.name})")] = d
    return found


def compare(old: Path, new: Path) -> list[str]:
    rows = ["| gate | file | masked lines that differ |", "|---|---|---|"]
    a, b = reports(old), reports(new)
    for name in sorted(a.keys() & b.keys()):
        for f in FILES:
            x, y = masked((a[name] / f).read_text(encoding="utf-8")), masked((b[name] / f).read_text(encoding="utf-8"))
            diff = [d for d in difflib.unified_diff(x, y, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("---", "+++")]
            rows.append(f"| {name} | {f} | {'identical' if not diff else len(diff)} |")
            for d in diff[:6]:
                rows.append(f"| | | `{d[:160].replace('|', '/')}` |")
    for name in sorted(a.keys() ^ b.keys()):
        rows.append(f"| {name} | - | only in {'old' if name in a else 'new'} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    text = "\n".join(compare(args.old, args.new)) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
