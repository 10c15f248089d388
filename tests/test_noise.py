"""The reference's own noise (docs/noise.md): `strict-gate noise` on the shipped toy baselines,
a gate judged against the profile, `band = "measured"`, ULPs, every report format.

Run as a user does: from a working directory with relative paths, on the committed vLLM
baselines (K = 5, real captured runs). No engine starts here: a recorded reference with no
[rescorer] measures its K runs and the second builds it is given (the live variations are
measured in benchmarks/README.md, "The reference's own noise").
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
from helpers import section, write_gate
from noise_fixtures import BF16, FP32, ROOT, cli, gate, layout, plant_self_flip

from strict_gate.noise.profile import load_profile
from strict_gate.noise.ulp import float_format, gap_ulps


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(layout(tmp_path))
    return tmp_path


def test_ulps_follow_the_dtypes_spacing():
    # RBLN PR 741's figures: a bf16 step is 0.125 in [16, 32) and 0.25 in [32, 64)
    assert float_format("bfloat16").spacing(20.0) == 0.125
    assert float_format("bf16").spacing(-40.0) == 0.25
    assert float_format("float16").spacing(1.0) == 2.0**-10
    assert float_format("torch.float32").spacing(1.5) == 2.0**-23
    assert float_format("float32").spacing(0.0) == 2.0**-149  # the smallest subnormal
    assert gap_ulps(0.25, "bfloat16", 20.0) == 2.0
    assert gap_ulps(0.25, "q4_k_m", 20.0) is None and gap_ulps(None, "bfloat16", 1.0) is None


def test_noise_profiles_the_shipped_baseline_beside_it(here):
    cfg = gate(here, "cap.toml", candidate=None)
    r = cli("noise", "gates/cap.toml", "--against", f"baselines/{BF16}")
    assert r.exit_code == 0, r.output
    path = here / "baselines" / FP32 / "noise.json"
    p = load_profile(path)
    assert cfg.exists() and p.provenance.k == 5 and p.provenance.dtype == "float32"
    assert p.provenance.battery.count == 128 and p.provenance.model_digest.startswith("sha256-files:")
    runs = next(v for v in p.variations if v.name == "runs-5")
    assert runs.same_build and runs.prompts == 128 and runs.flips == 0  # vLLM fp32 repeated itself 5 times
    build = next(v for v in p.variations if v.kind == "second_build")
    assert not build.same_build and build.flips == len(p.flips_of(build.name)) > 0
    for f in p.flips_of(build.name):  # each flip's gap is the larger known side, in fp32 ulps at its |logprob|
        assert f.gap == max(g for g in f.gaps if g is not None)
        assert f.ulps == pytest.approx(f.gap / float_format("float32").spacing(f.magnitude))
    assert p.largest_self_flip_gap is None  # the bf16 build's flips are not the reference's own
    assert "runs-5" in r.output and "build:" in r.output


def test_a_self_flip_sets_the_measured_band(here):
    pos, gap = plant_self_flip(here / "baselines" / FP32)
    gate(here, "cap.toml", candidate=None)
    assert cli("noise", "gates/cap.toml").exit_code == 0
    p = load_profile(here / "baselines" / FP32 / "noise.json")
    (flip,) = p.self_flips
    assert (flip.variation, flip.id, flip.position) == ("runs-5", "prose-001", pos)
    assert math.isclose(p.largest_self_flip_gap, gap, rel_tol=1e-12) and flip.gaps[1] is None  # samples keep no logprobs
    gate(here, band="measured", noise={"floor": 0.0})
    r = cli("gate", "gates/gate.toml")
    report = json.loads(next((here / "reports").glob("gate-*/report.json")).read_text())
    assert report["band"] == pytest.approx(gap)
    noise = section(report, "noise")
    assert f"largest self-flip gap {gap:.4g} nats over runs-5" in noise["band_rule"]
    wheres = {f["where"] for f in noise["flips"]}
    within = [f for f in noise["flips"] if f["where"] == "within its noise"]
    assert all(f["gap"] <= gap + 1e-9 for f in within) and wheres <= {
        "within its noise", "beyond its noise, inside the band", "beyond the band", "gap unknown"}
    assert "within the reference's own noise" in r.output or not within


def test_every_report_places_the_candidates_flips(here):
    gate(here, "cap.toml", candidate=None)
    assert cli("noise", "gates/cap.toml", "--against", f"baselines/{BF16}").exit_code == 0
    gate(here, band="measured", noise={"floor": 0.05})
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 1, r.output  # the bf16 build flips beyond a 0.05 band
    out = next((here / "reports").glob("gate-*"))
    report = json.loads((out / "report.json").read_text())
    noise = section(report, "noise")
    assert report["band"] == 0.05 and "floor 0.05 nats" in noise["band_rule"]
    assert "no self-flip over runs-5 (0)" in noise["band_rule"]
    n = noise["prompts_flipped"]
    assert n == len(noise["flips"]) > 0 and noise["headline"].startswith(f"candidate flips on {n}/128 prompts")
    assert "the reference against itself at most 0/128 (runs-5)" in noise["headline"]
    assert "another build of it build:tiny-llama-vllm-bf16" in noise["headline"]
    md = (out / "report.md").read_text()
    assert "## The reference's own noise" in md and "The band is measured: band = max(floor 0.05" in md
    html = (out / "report.html").read_text()
    assert "<svg class='noise'" in html and "<script" not in html and "band 0.05" in html
    assert html.count("<circle") >= n
    junit = (out / "junit.xml").read_text()
    assert 'name="noise"' in junit and 'name="noise_band_rule"' in junit and "noise: gap" in junit
    assert "noise: candidate flips on" in r.output


def test_a_fixed_band_is_annotated_not_replaced(here):
    gate(here, "cap.toml", candidate=None)
    assert cli("noise", "gates/cap.toml").exit_code == 0
    gate(here, band=0.5, noise={})
    cli("gate", "gates/gate.toml")
    report = json.loads(next((here / "reports").glob("gate-*/report.json")).read_text())
    assert report["band"] == 0.5 and section(report, "noise")["band_rule"] is None


def test_the_command_lines_band_over_a_measured_one_is_said(here):
    gate(here, "cap.toml", candidate=None)
    assert cli("noise", "gates/cap.toml").exit_code == 0
    gate(here, band="measured", noise={"floor": 0.05})
    cli("gate", "gates/gate.toml", "--band", "0.5")
    report = json.loads(next((here / "reports").glob("gate-*/report.json")).read_text())
    assert report["band"] == 0.5 and section(report, "noise")["band_rule"] is None
    assert any("judged instead" in n for n in section(report, "noise")["notes"])


def test_the_ulps_rule_raises_the_band_with_the_magnitude(here):
    plant_self_flip(here / "baselines" / FP32)
    gate(here, "cap.toml", candidate=None)
    assert cli("noise", "gates/cap.toml").exit_code == 0
    p = load_profile(here / "baselines" / FP32 / "noise.json")
    spacing = float_format("float32").spacing(p.largest_magnitude)
    gate(here, band="measured", noise={"ulps": 1e6})
    cli("gate", "gates/gate.toml")
    report = json.loads(next((here / "reports").glob("gate-*/report.json")).read_text())
    assert report["band"] == pytest.approx(max(1e6 * spacing, p.largest_self_flip_gap))
    assert "1e+06 x float32 spacing" in section(report, "noise")["band_rule"]


@pytest.mark.slow
def test_live_variations_on_a_real_engine(tmp_path, monkeypatch):
    """The bundled model through transformers (float32, a real engine): K live runs, batch 4
    against batch 1, prefill against decode at every step, and vLLM's fp32 golden as a second
    build, on the smoke prompts, and a prefill 16 tokens at a time (hf's chunked prefill, through
    its cache)."""
    pytest.importorskip("transformers")
    monkeypatch.chdir(layout(tmp_path))
    shutil.copy(ROOT / "prompts" / "smoke.jsonl", tmp_path / "prompts")
    write_gate(tmp_path / "gates", file="hf.toml", prompts="../prompts/smoke.jsonl", max_tokens=8, top_logprobs=5,
               reference={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"})
    r = cli("noise", "gates/hf.toml", "--runs", "2", "--batch", "4", "--chunk", "16", "--out", "hf-noise.json")
    assert r.exit_code == 0, r.output
    p = load_profile(tmp_path / "hf-noise.json")
    names = [v.name for v in p.variations]
    assert names == ["runs-2", "batch-4", "chunked_prefill-16", "prefill-decode"], names
    pd = p.variations[-1]
    assert pd.prompts == 8 and 0 < pd.positions <= 64  # every step of every prompt's own tokens
    assert p.provenance.k == 2 and p.provenance.baseline is None and p.provenance.engine == "hf"
    assert not any("chunked prefill not run" in n for n in p.provenance.notes), p.provenance.notes
    assert list((tmp_path / "reports").glob("hf-noise-*/invariance/reference/chunked_prefill-16/records.jsonl"))
    assert list((tmp_path / "reports").glob("hf-noise-*/invariance/reference/batch-4/records.jsonl"))


def test_a_flip_is_placed_by_the_references_own_reach_then_the_band():
    from strict_gate.noise.annotate import Where, place

    assert place(0.2, 0.2, 0.5) == Where.WITHIN  # the reference itself flipped a choice this close
    assert place(0.2000001, 0.2, 0.5) == Where.BEYOND_NOISE
    assert place(0.5, 0.2, 0.5) == Where.BEYOND_NOISE and place(0.51, 0.2, 0.5) == Where.BEYOND_BAND
    assert place(0.0, None, 0.5) == Where.BEYOND_NOISE  # it never flipped: even an exact tie is beyond its noise
    assert place(None, 0.2, 0.5) == Where.UNKNOWN
