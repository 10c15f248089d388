"""Reports: one GateResult, one writer per format. Each file is written atomically.

The guarantees every format shares are applied here, once: secrets scrubbed from the result
before any renderer escapes its text, no raw control character in the text formats, and
report.json strict JSON (a non-finite number, a NaN timing or an infinite gap, becomes null).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from strict_gate.core.redact import scrub_obj
from strict_gate.judge.result import REPORT_SCHEMA, GateResult, to_json
from strict_gate.report import html, junit, markdown
from strict_gate.report.text import visible
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.records import write_text_atomic

_SURROGATE = re.compile("[\ud800-\udfff]")
FORMATS = ("json", "md", "html", "junit")


def write_reports(result: GateResult, out_dir: str | Path, formats=FORMATS) -> dict[str, Path]:
    """Write the chosen formats; report.json goes last, so its presence means the set is whole."""
    out = ReportDir(Path(out_dir))
    result = scrub_obj(result)
    written = {}
    renderers = {
        "md": lambda: markdown.render(result),
        "html": lambda: html.render(result),
        "junit": lambda: junit.render(result),
    }
    for fmt in formats:
        if fmt != "json":
            path = out.report(fmt)
            write_text_atomic(path, visible(renderers[fmt](), keep_newlines=True))
            written[fmt] = path
    if "json" in formats:
        path = out.report_json
        text = json.dumps(strict_json(to_json(result)), indent=2, ensure_ascii=False, allow_nan=False)
        write_text_atomic(path, text + "\n")
        written["json"] = path
    return written


def strict_json(obj: Any) -> Any:
    """NaN and infinities as null (strict JSON parsers, most CI tools, reject them), and a lone
    surrogate (an engine's "\\ud800") as visible text, since no UTF-8 file can hold it."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, str):
        return obj.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(obj) else obj
    if isinstance(obj, dict):
        return {strict_json(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


__all__ = ["FORMATS", "REPORT_SCHEMA", "GateResult", "to_json", "write_reports"]
