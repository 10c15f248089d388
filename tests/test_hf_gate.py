"""The CLI end to end with the real `hf` engine on the bundled model (transformers, CPU)."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import need
from helpers import toml_text, write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

need("transformers")
pytestmark = pytest.mark.slow

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "prompts" / "smoke.jsonl"
BATTERY = REPO / "prompts" / "battery-128.jsonl"


def gate(tmp_path, *, cand_model="bundled:tiny-llama", cand_dtype="float32", prompts=SMOKE, max_tokens=12,
         policy="strict", name="g", ref_dtype="float32"):
    return write_gate(tmp_path, file=f"{name}.toml", name=name, prompts=prompts, max_tokens=max_tokens, policy=policy,
                      output_dir=tmp_path / "reports",
                      reference={"kind": "hf", "model": "bundled:tiny-llama", "dtype": ref_dtype},
                      candidate={"kind": "hf", "model": cand_model, "dtype": cand_dtype, "env": {"DEVICE_KDA": "1"}})


def report_of(tmp_path, name="g"):
    (d,) = [p for p in (tmp_path / "reports").iterdir() if p.name.startswith(name + "-")]
    return d, json.loads((d / "report.json").read_text())


def test_same_engine_same_dtype_passes(tmp_path):
    r = runner.invoke(app, ["gate", str(gate(tmp_path))])
    assert r.exit_code == 0, r.output
    d, rep = report_of(tmp_path)
    assert rep["verdict"] == "pass" and rep["summary"]["prompts_exact"] == 8
    assert rep["summary"]["positions_matched"] == rep["summary"]["positions_total"] > 0
    assert rep["engines"]["candidate"]["env"] == {"DEVICE_KDA": "1"}
    assert rep["engines"]["reference"]["versions"]["transformers"]
    md = (d / "report.md").read_text()
    assert md.startswith("# PASS: g — 8/8 prompts exact")
    cand = json.loads((d / "candidate" / "manifest.json").read_text())
    assert cand["status"] == "complete" and cand["records"] == 8


def test_bfloat16_candidate_is_classified(tmp_path):
    """fp32 reference vs bf16 candidate: the arms really differ; every difference is classified."""
    r = runner.invoke(app, ["gate", str(gate(tmp_path, cand_dtype="bfloat16", prompts=BATTERY, max_tokens=8))])
    d, rep = report_of(tmp_path)
    bad = [p for p in rep["prompts"] if p["status"] != "match"]
    assert bad, "bfloat16 should flip at least one of 128 prompts on this model"
    assert r.exit_code == 1 and rep["verdict"] == "fail"
    for p in bad:
        assert p["status"] in ("near_tie", "divergent", "length_mismatch")
        fd = p["first_divergence"]
        if p["status"] == "near_tie":
            assert fd["reference_gap"] <= 0.5 and fd["candidate_gap"] <= 0.5
        if p["status"] in ("near_tie", "divergent"):
            dg = p["diagnosis"]
            assert dg is not None and dg["position"] == fd["position"]
            # the fp32 reference's re-scored gap on the same prefix equals its decode gap
            if fd["reference_gap"] is not None and dg["rescored_gap"] is not None:
                assert abs(dg["rescored_gap"] - fd["reference_gap"]) < 1e-3
    assert rep["rescored_by"] == "hf bundled:tiny-llama"
    md = (d / "report.md").read_text()
    assert "## Prompts that do not match" in md and "## Teacher-forced diagnosis" in md
    assert "hf bundled:tiny-llama re-scored each divergent prompt" in md


@pytest.fixture(scope="module")
def perturbed_model(tmp_path_factory):
    """A candidate with a deliberately broken weight: a real forward bug, not a near-tie."""
    import torch
    from transformers import AutoModelForCausalLM

    from strict_gate.core.model_files import resolve_model

    src = Path(resolve_model("bundled:tiny-llama", REPO))
    out = tmp_path_factory.mktemp("perturbed")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        w = model.model.layers[-1].mlp.down_proj.weight
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * w.abs().mean() * 4)
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def test_perturbed_weight_is_a_real_divergence(tmp_path, perturbed_model):
    r = runner.invoke(app, ["gate", str(gate(tmp_path, cand_model=str(perturbed_model), policy="near-tie"))])
    assert r.exit_code == 1, r.output
    _, rep = report_of(tmp_path)
    divergent = [p for p in rep["prompts"] if p["status"] == "divergent"]
    assert divergent, [p["status"] for p in rep["prompts"]]
    real = [p for p in divergent if p["diagnosis"]["rescored_gap"] is None or p["diagnosis"]["rescored_gap"] > 0.5]
    assert real and all("real divergence" in p["diagnosis"]["verdict"] for p in real)


def test_run_then_compare_and_diagnose(tmp_path):
    eng = tmp_path / "engine.toml"
    eng.write_text(toml_text({"kind": "hf", "model": "bundled:tiny-llama", "dtype": "bfloat16"}))
    r = runner.invoke(app, ["run", str(eng), "--prompts", str(SMOKE), "--out", str(tmp_path / "bf16"),
                            "--max-tokens", "8"])
    assert r.exit_code == 0, r.output
    eng.write_text(toml_text({"kind": "hf", "model": "bundled:tiny-llama"}))
    r = runner.invoke(app, ["run", str(eng), "--prompts", str(SMOKE), "--out", str(tmp_path / "fp32"),
                            "--max-tokens", "8"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["compare", str(tmp_path / "fp32"), str(tmp_path / "fp32"), "--policy", "strict"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["compare", str(tmp_path / "fp32"), str(tmp_path / "bf16"), "--out", str(tmp_path / "c")])
    assert r.exit_code in (0, 1)
    rep = json.loads((tmp_path / "c" / "report.json").read_text())
    assert rep["summary"]["prompts_total"] == 8

    # diagnose a finished gate: it re-scores with the reference and rewrites the report
    runner.invoke(app, ["gate", str(gate(tmp_path, cand_dtype="bfloat16", prompts=BATTERY, max_tokens=8, name="d"))])
    d, before = report_of(tmp_path, "d")
    (d / "report.md").unlink()
    r = runner.invoke(app, ["diagnose", str(d)])
    assert r.exit_code == {"pass": 0, "fail": 1}.get(before["verdict"], 3), r.output
    after = json.loads((d / "report.json").read_text())
    assert (d / "report.md").exists()
    assert [p["diagnosis"] is not None for p in after["prompts"]] == [p["diagnosis"] is not None for p in before["prompts"]]


def test_batch_option_reaches_the_engine(tmp_path):
    """batch = 4 sends four prompts per generate() (left-padded); records stay per prompt, in order."""
    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.gate.arm import prompt_inputs, run_arm
    from strict_gate.runs.prompts import load_prompts
    from strict_gate.runs.reader import load_run
    from strict_gate.runs.records import Sampling

    ps = load_prompts(SMOKE)
    eng = HFEngine(HFOptions(model="bundled:tiny-llama", batch=4), base_dir=REPO)
    calls = []
    original = eng._generate_batch
    eng._generate_batch = lambda prompts, sampling: calls.append(len(prompts)) or original(prompts, sampling)
    run = run_arm(eng, prompt_inputs(ps, eng), Sampling(6, 5), tmp_path / "run", prompt_set=ps)
    assert calls == [4, 4]
    assert list(run.records) == ps.ids and load_run(tmp_path / "run").complete
    for rec in run.records.values():
        assert 1 <= len(rec.token_ids) <= 6 and len(rec.top_logprobs) == len(rec.token_ids)
        assert all(step[0][0] == tok for step, tok in zip(rec.top_logprobs, rec.token_ids))
