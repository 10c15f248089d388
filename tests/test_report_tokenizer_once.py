"""One gate's reports load its tokenizer once (issue 37 item 4): write_reports hands one decoder
to every format that decodes tokens, instead of report.md and report.html each loading it."""

from __future__ import annotations

from dataclasses import replace

import tokenizers
from helpers import rec, write_run

from strict_gate.gate.stored import compare_run_dirs
from strict_gate.report import write_reports
from strict_gate.report.text import Decoder

TOKENIZER = "bundled:tiny-llama"


def test_one_write_reports_loads_the_tokenizer_once(tmp_path, monkeypatch):
    ref = write_run(tmp_path / "ref", [rec("a", [300, 301, 302]), rec("b", [400, 401])])
    cand = write_run(tmp_path / "cand", [rec("a", [300, 305, 306]), rec("b", [400, 401])])
    result = compare_run_dirs(ref, cand, policy="strict", band=0.1)
    result = replace(result, reference=replace(result.reference, tokenizer=TOKENIZER))
    shown = Decoder(TOKENIZER).token(305)  # the candidate's first divergent token, as both formats print it

    loads: list[str] = []
    real = tokenizers.Tokenizer

    class Counting:
        @staticmethod
        def from_file(path: str):
            loads.append(path)
            return real.from_file(path)

    monkeypatch.setattr(tokenizers, "Tokenizer", Counting)
    written = write_reports(result, tmp_path / "out")

    assert set(written) == {"json", "md", "html", "junit"}
    assert len(loads) == 1, loads
    for fmt in ("md", "html"):  # both formats decoded with it: the one load served them both
        assert shown in written[fmt].read_text(encoding="utf-8"), fmt
