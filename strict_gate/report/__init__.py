"""Reports: one GateResult, one writer per format. Each file is written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from strict_gate.records import write_text_atomic
from strict_gate.report import html, junit, markdown
from strict_gate.report.result import REPORT_SCHEMA, GateResult, to_json

FORMATS = ("json", "md", "html", "junit")
FILES = {"json": "report.json", "md": "report.md", "html": "report.html", "junit": "junit.xml"}


def write_reports(result: GateResult, out_dir: str | Path, formats=FORMATS) -> dict[str, Path]:
    """Write the chosen formats; report.json goes last, so its presence means the set is whole."""
    out = Path(out_dir)
    written = {}
    renderers = {
        "md": lambda: markdown.render(result),
        "html": lambda: html.render(result),
        "junit": lambda: junit.render(result),
    }
    for fmt in formats:
        if fmt != "json":
            path = out / FILES[fmt]
            write_text_atomic(path, renderers[fmt]())
            written[fmt] = path
    if "json" in formats:
        path = out / FILES["json"]
        write_text_atomic(path, json.dumps(to_json(result), indent=2, ensure_ascii=False) + "\n")
        written["json"] = path
    return written


__all__ = ["FORMATS", "REPORT_SCHEMA", "GateResult", "to_json", "write_reports"]
