"""The CI job summary: report.md's head, cut under GitHub's size limit, written to a file and
appended to $GITHUB_STEP_SUMMARY. A report format, so `gate --summary` and the nightly loop
(which adds its night-to-night diff) write it the same way, without the report importing nightly."""

from __future__ import annotations

import os
from pathlib import Path

from strict_gate.core.redact import scrub_obj
from strict_gate.errors import InputError
from strict_gate.judge.result import GateResult
from strict_gate.report import markdown
from strict_gate.report.text import Decoder, visible
from strict_gate.runs.records import write_text_atomic

SUMMARY_MAX_BYTES = 512 << 10  # GitHub drops a step summary over 1 MiB, and with it the verdict


def capped(text: str, limit: int = SUMMARY_MAX_BYTES) -> str:
    """`text` cut at a line before `limit` UTF-8 bytes, saying so: the head (the verdict) stays."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    note = (f"\n… summary cut at {limit >> 10} KiB (of {len(data) >> 10} KiB): report.md and diff.json in the "
            "report directory hold everything.\n")
    keep = data[: limit - len(note.encode("utf-8"))]
    keep = keep[: keep.rfind(b"\n") + 1] if b"\n" in keep else keep
    return keep.decode("utf-8", "ignore") + note


def summary_markdown(result: GateResult, dec: Decoder | None = None) -> str:
    """report.md's head (verdict, figures, why, trend), scrubbed like every report; `dec` is the
    gate's decoder when it has one (GateOutcome.decoder)."""
    return visible(markdown.summary(scrub_obj(result), dec), keep_newlines=True)


def write_summary(text: str, path: str | Path | None = None) -> None:
    """Write the summary to `path` and append it to $GITHUB_STEP_SUMMARY when that is set."""
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    target = path
    text = capped(text)
    try:
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(path), text)
        if step:
            target = step
            with open(step, "a", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
    except OSError as e:
        raise InputError(f"cannot write the summary: {e.strerror or e}", path=str(target)) from None
