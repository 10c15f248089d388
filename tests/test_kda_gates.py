"""The shipped KDA gates (gates/kda-*.toml) end to end, on the smoke prompts to keep CI short:
hf reference (transformers' chunk-prefill path) against the example engine over the command
protocol, with the seed's switches in the candidate's env."""

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import need

from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate

need("transformers")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def run(tmp_path, name):
    cfg = load_gate_config(ROOT / "gates" / f"{name}.toml")
    cfg = replace(cfg, prompts=ROOT / "prompts" / "smoke.jsonl", max_tokens=8, output_dir=tmp_path)
    return cfg, run_gate(cfg)


def test_chunk_prefill_gate_matches(tmp_path):
    cfg, outcome = run(tmp_path, "kda-chunk")
    r = outcome.result
    assert cfg.candidate.env == {"DEVICE_KDA": "1", "KDA_CHUNK_PREFILL": "1", "KDA_THREADS": "1"}
    assert r.candidate.kind == "command" and r.reference.kind == "hf"
    assert r.verdict.verdict == "pass", r.verdict.reasons
    assert (outcome.report_dir / "candidate" / "engine.log").read_text().count("prefill chunk") >= 1


def test_recurrent_prefill_gate_is_classified(tmp_path):
    cfg, outcome = run(tmp_path, "kda-recurrent")
    r = outcome.result
    assert cfg.candidate.env["KDA_CHUNK_PREFILL"] == "0"
    assert "prefill recurrent" in (outcome.report_dir / "candidate" / "engine.log").read_text()
    assert r.verdict.verdict in ("pass", "fail") and not r.problems
    for p in r.comparison.prompts:
        assert p.status in ("match", "near_tie", "divergent")
        if p.status != "match":
            assert r.diagnoses[p.id].error is None
