"""One gate's reports load its tokenizer once (issue 37 item 4): write_reports hands one decoder
to every format that decodes tokens, instead of report.md and report.html each loading it, and a
CLI gate hands the same one on to its job summary and console table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import tokenizers
from helpers import rec, write_gate, write_run

from strict_gate.offline.compare import compare_run_dirs
from strict_gate.report import write_reports
from strict_gate.report.text import Decoder

TOKENIZER = "bundled:tiny-llama"


def _count_loads(monkeypatch) -> list[str]:
    """The tokenizer files loaded from here on, one entry a load."""
    loads: list[str] = []
    real = tokenizers.Tokenizer

    class Counting:
        @staticmethod
        def from_file(path: str):
            loads.append(path)
            return real.from_file(path)

    monkeypatch.setattr(tokenizers, "Tokenizer", Counting)
    return loads


def test_one_write_reports_loads_the_tokenizer_once(tmp_path, monkeypatch):
    ref = write_run(tmp_path / "ref", [rec("a", [300, 301, 302]), rec("b", [400, 401])])
    cand = write_run(tmp_path / "cand", [rec("a", [300, 305, 306]), rec("b", [400, 401])])
    result = compare_run_dirs(ref, cand, policy="strict", band=0.1)
    result = replace(result, reference=replace(result.reference, tokenizer=TOKENIZER))
    shown = Decoder(TOKENIZER).token(305)  # the candidate's first divergent token, as both formats print it

    loads = _count_loads(monkeypatch)
    written = write_reports(result, tmp_path / "out")

    assert set(written) == {"json", "md", "html", "junit"}
    assert len(loads) == 1, loads
    for fmt in ("md", "html"):  # both formats decoded with it: the one load served them both
        assert shown in written[fmt].read_text(encoding="utf-8"), fmt


def test_one_cli_gate_with_a_summary_loads_the_tokenizer_once(tmp_path, monkeypatch):
    """`strict-gate gate --summary`: the reports, the job summary and the console table share the
    gate's one decoder (an offline gate replaying two committed baselines, no engine started)."""
    from typer.testing import CliRunner

    from strict_gate.cli import app

    repo = Path(__file__).resolve().parent.parent
    cfg = write_gate(tmp_path, name="once", prompts=repo / "prompts" / "battery-128.jsonl", max_tokens=16,
                     policy="strict", band=0.1, output_dir=tmp_path / "reports",
                     reference={"kind": "recorded", "path": repo / "baselines" / "tiny-llama-vllm-fp32",
                                "model": TOKENIZER},
                     candidate={"kind": "recorded", "path": repo / "baselines" / "tiny-llama-vllm-bf16"})
    loads = _count_loads(monkeypatch)
    r = CliRunner().invoke(app, ["gate", str(cfg), "--summary", str(tmp_path / "s.md")])

    assert r.exit_code == 1, r.output  # fp32 against bf16 at band 0.1 diverges: every renderer decodes
    assert (tmp_path / "s.md").read_text(encoding="utf-8").startswith("# FAIL: once")
    assert len(loads) == 1, loads
