"""`drift = true` end to end with the real hf engine on the bundled model (transformers, CPU)."""

import json
from pathlib import Path

import pytest
from conftest import need
from helpers import section, toml_text, write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

need("transformers")
pytestmark = pytest.mark.slow

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "prompts" / "smoke.jsonl"
TOTALS = {"same_top1_rate", "abs_dlogprob", "kl", "min_reference_margin", "positions_within_band", "positions"}


def drift_of(tmp_path, cand_dtype: str) -> tuple[Path, dict]:
    g = write_gate(tmp_path, file=f"{cand_dtype}.toml", name=cand_dtype, prompts=SMOKE, max_tokens=8, policy="near-tie",
                   drift=True, output_dir=tmp_path / "reports",
                   reference={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"},
                   candidate={"kind": "hf", "model": "bundled:tiny-llama", "dtype": cand_dtype})
    r = runner.invoke(app, ["gate", str(g)])
    assert r.exit_code in (0, 1), r.output
    (d,) = [p for p in (tmp_path / "reports").iterdir() if p.name.startswith(cand_dtype + "-")]
    rep = json.loads((d / "report.json").read_text())
    assert "drift: same top-1" in r.output
    return d, rep


def test_bf16_candidate_drift_figures(tmp_path):
    d, rep = drift_of(tmp_path, "bfloat16")
    drift = section(rep, "drift")
    assert drift.keys() >= TOTALS
    assert drift["positions"] == rep["summary"]["positions_total"] == 64
    assert drift["prompts_scored"] == 8 and drift["prompts_missing"] == {}
    assert set(drift["prompts"]) == {p["id"] for p in rep["prompts"]}
    assert "KL(ref||cand)" in drift["kl"]["estimator"]
    assert 0 < drift["abs_dlogprob"]["mean"] <= drift["abs_dlogprob"]["p99"] <= drift["abs_dlogprob"]["max"] < 1
    assert 0 <= drift["kl"]["mean"] <= drift["kl"]["max"]
    assert 0.5 < drift["same_top1_rate"] <= 1.0
    for pid, p in drift["prompts"].items():
        assert p["positions"] == 8 and 0 <= p["same_top1"] <= 8
        assert p["abs_dlogprob"]["max"] <= drift["abs_dlogprob"]["max"]
        assert p["min_reference_margin"] >= drift["min_reference_margin"]
    assert sum(p["positions_within_band"] for p in drift["prompts"].values()) == drift["positions_within_band"]
    md = (d / "report.md").read_text()
    assert "## Drift before a flip" in md
    junit = (d / "junit.xml").read_text()
    assert 'name="drift_same_top1_rate"' in junit
    # `strict-gate diagnose` rewrites the reports and keeps the gate's drift figures
    (d / "report.md").unlink()
    r = runner.invoke(app, ["diagnose", str(d)])
    assert r.exit_code in (0, 1), r.output
    assert section(json.loads((d / "report.json").read_text()), "drift") == drift
    assert "## Drift before a flip" in (d / "report.md").read_text()


def test_same_engine_same_dtype_has_no_drift(tmp_path):
    _, rep = drift_of(tmp_path, "float32")
    drift = section(rep, "drift")
    assert rep["verdict"] == "pass"
    assert drift["same_top1_rate"] == 1.0 and drift["positions"] == 64
    assert drift["abs_dlogprob"]["max"] < 1e-4  # prefill vs decode in float32: float noise only
    assert drift["kl"]["max"] < 1e-6


def test_stored_reference_is_scored_by_the_still_loaded_candidate(tmp_path):
    """A recorded reference (the nightly case): the pass runs right after generation, no reload."""
    eng = tmp_path / "engine.toml"
    eng.write_text(toml_text({"kind": "hf", "model": "bundled:tiny-llama"}))
    r = runner.invoke(app, ["run", str(eng), "--prompts", str(SMOKE), "--out", str(tmp_path / "base"),
                            "--max-tokens", "8"])
    assert r.exit_code == 0, r.output
    g = write_gate(tmp_path, file="stored.toml", name="stored", prompts=SMOKE, max_tokens=8, policy="strict", drift=True,
                   output_dir=tmp_path / "reports", reference={"kind": "recorded", "path": tmp_path / "base"},
                   candidate={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"})
    r = runner.invoke(app, ["gate", str(g)])
    assert r.exit_code == 0, r.output
    (d,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    drift = section(json.loads((d / "report.json").read_text()), "drift")
    assert drift["prompts_scored"] == 8 and drift["same_top1_rate"] == 1.0
    assert drift["abs_dlogprob"]["max"] < 1e-4
    assert drift["seconds"]["start"] < 0.5  # the candidate was still loaded


def test_without_drift_the_report_says_null(tmp_path):
    hf = {"kind": "hf", "model": "bundled:tiny-llama"}
    g = write_gate(tmp_path, file="plain.toml", name="plain", prompts=SMOKE, max_tokens=4, policy="strict",
                   output_dir=tmp_path / "reports", reference=hf, candidate=hf)
    r = runner.invoke(app, ["gate", str(g)])
    assert r.exit_code == 0, r.output
    (d,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    assert section(json.loads((d / "report.json").read_text()), "drift") is None
    assert "Drift before a flip" not in (d / "report.md").read_text() and "drift:" not in r.output
