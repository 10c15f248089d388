"""Reports: one GateResult, one writer per format. Each file is written atomically.

The guarantees every format shares are applied here, once: secrets scrubbed from the result
before any renderer escapes its text, no raw control character in the text formats, and
report.json strict JSON (a non-finite number, a NaN timing or an infinite gap, becomes null) and
in its declared shape (judge/schema.py): a key no reader knows is a bug caught before writing.
"""

from __future__ import annotations

import json
from pathlib import Path

from strict_gate.core.redact import scrub_obj
from strict_gate.judge.result import REPORT_SCHEMA, GateResult, to_json
from strict_gate.judge.schema import check_written
from strict_gate.report import html, junit, markdown
from strict_gate.report.text import Decoder, gate_decoder, strict_json, visible
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.records import write_parts_atomic, write_text_atomic

FORMATS = ("json", "md", "html", "junit")


def write_reports(result: GateResult, out_dir: str | Path, formats=FORMATS, dec: Decoder | None = None) -> dict[str, Path]:
    """Write the chosen formats; report.json goes last, so its presence means the set is whole.
    `dec` is the gate's decoder when the caller built it (gate_decoder) to hand on to its summary
    and console table too."""
    out = ReportDir(Path(out_dir))
    result = scrub_obj(result)
    written = {}
    # One decoder for the formats that decode tokens: the tokenizer is loaded once, not per format.
    if dec is None and {"md", "html"} & set(formats):
        dec = gate_decoder(result)
    renderers = {  # each format's parts: report.html's are made as they are written, never one string
        "md": lambda: (markdown.render(result, dec),),
        "html": lambda: html.render_parts(result, dec),
        "junit": lambda: (junit.render(result),),
    }
    for fmt in formats:
        if fmt != "json":
            path = out.report(fmt)
            write_parts_atomic(path, (visible(part, keep_newlines=True) for part in renderers[fmt]()))
            written[fmt] = path
    if "json" in formats:
        path = out.report_json
        body = strict_json(to_json(result))
        check_written(body)  # every key declared in judge/schema.py (and each feature's section shape)
        text = json.dumps(body, indent=2, ensure_ascii=False, allow_nan=False)
        write_text_atomic(path, text + "\n")
        written["json"] = path
    return written


__all__ = ["FORMATS", "REPORT_SCHEMA", "GateResult", "strict_json", "to_json", "write_reports"]
