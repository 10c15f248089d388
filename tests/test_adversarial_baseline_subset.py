"""A stored reference fits only the prompt set it was captured on (docs/baselines.md, "A subset of
a baseline's prompts"): a baseline records one sha256 of its whole set, not each prompt's text, so
a subset, or the same ids with a prompt's text changed, is refused before any engine loads (exit 2,
naming the baseline and the field), never gated against ids captured for another text. The whole
set still fits. On the committed baseline of the bundled model, from a working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "baselines" / "tiny-llama-vllm-fp32"
BATTERY = REPO / "prompts" / "battery-128.jsonl"


def _gate(tmp_path: Path, monkeypatch, lines: list[str], candidate: dict) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    Path("prompts.jsonl").write_text("".join(lines))
    write_gate(Path("."), name="subset", prompts="prompts.jsonl", max_tokens=16, top_logprobs=5, policy="near-tie",
               band=0.5, output_dir="reports", diagnose=False,
               reference={"kind": "recorded", "path": os.path.relpath(BASELINE), "model": "bundled:tiny-llama"},
               candidate=candidate)
    r = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=300)
    return r.exit_code, r.output


HF = {"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"}


def test_ten_prompts_of_the_battery_are_refused_naming_the_baseline(tmp_path, monkeypatch):
    lines = BATTERY.read_text(encoding="utf-8").splitlines(keepends=True)[:10]
    code, out = _gate(tmp_path, monkeypatch, lines, HF)
    assert code == 2, out
    assert "does not fit this gate: prompt set sha256" in out and "tiny-llama-vllm-fp32" in out
    assert "Traceback" not in out and not list(Path("reports").glob("*/candidate/records.jsonl"))


def test_the_same_ids_with_one_text_changed_are_refused(tmp_path, monkeypatch):
    lines = BATTERY.read_text(encoding="utf-8").splitlines(keepends=True)
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "text": first["text"] + " and"}) + "\n"
    code, out = _gate(tmp_path, monkeypatch, lines, HF)
    assert code == 2 and "prompt set sha256" in out, out


def test_the_whole_set_fits(tmp_path, monkeypatch):
    """A recorded candidate (the bf16 baseline), so no model loads: the set is accepted and judged."""
    lines = BATTERY.read_text(encoding="utf-8").splitlines(keepends=True)
    monkeypatch.chdir(tmp_path)  # the paths relative to the gate's directory
    code, out = _gate(tmp_path, monkeypatch, lines,
                      {"kind": "recorded", "path": os.path.relpath(REPO / "baselines" / "tiny-llama-vllm-bf16")})
    assert code in (1, 3) and "does not fit" not in out, out
    assert "prompts exact" in out
