"""The speed arm on the real in-process engines (transformers, vLLM) and the shipped speed gate.

No timing is asserted here (the machine is shared): figures must be positive and finite, every
sequence must be exactly max_tokens long (ignore_eos honoured), and the matched check must pass
for matched configs and flag eager-vs-compiled. vLLM is the session's one shared engine.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import ROOT, VLLM_OPTIONS, need
from helpers import section
from typer.testing import CliRunner

from strict_gate.gate.config import load_gate_config
from strict_gate.speed.bench import SpeedSession
from strict_gate.speed.config import SpeedConfig, TokenRules, parse_rung
from strict_gate.speed.config import of as speed_of
from strict_gate.speed.matched import check_matched
from strict_gate.speed.measure import ArmMeasurement
from strict_gate.speed.model import FigureName, Method

pytestmark = pytest.mark.slow


def hf_engine(dtype: str = "float32"):
    need("transformers")
    from strict_gate.engines.hf import HFEngine, HFOptions

    return HFEngine(HFOptions(model="bundled:tiny-llama", dtype=dtype, threads=1), base_dir=ROOT)


RULES = TokenRules(top_logprobs=5, band=0.5, greedy_tolerance=1e-3)  # the gate defaults


def small_ladder() -> SpeedConfig:
    return SpeedConfig(warmup=0, runs=2, rungs=(parse_rung("32/8"), parse_rung("gate")), concurrency=(1, 2))


def gate_inputs(engine):
    from strict_gate.gate.arm import prompt_inputs
    from strict_gate.runs.prompts import load_prompts

    return prompt_inputs(load_prompts(ROOT / "prompts" / "smoke.jsonl"), engine)[:2]


def assert_sane(result, max_tokens: dict[str, int]) -> None:
    assert [r.rung.name for r in result.rungs] == ["32/8", "32/8@2", "gate"]
    for rung in result.rungs:
        assert rung.error is None, rung.error
        assert rung.token_check.verified is True, rung.token_check  # the two arms' timed tokens agree
        for arm in (rung.reference, rung.candidate):
            assert arm.tokens == max_tokens[rung.rung.name]
            for name in FigureName:
                fig = arm.figure(name)
                # two-request decode: a repetition whose full request ran faster than the median
                # TTFT request (two loaded cores) gives no decode sample, by design (speed/measure.py)
                wanted = (1, 2) if name is FigureName.DECODE else (2,)
                assert len(fig.samples) in wanted and all(math.isfinite(x) and x > 0 for x in fig.samples), (rung, name)


@pytest.mark.vllm
def test_hf_against_vllm_small_ladder(vllm_engine):
    hf = hf_engine()
    session = SpeedSession(small_ladder(), 4, gate_inputs(hf), {"reference": vllm_engine, "candidate": hf}, RULES)
    session.measure("candidate", hf)
    session.measure("reference", vllm_engine)  # the shared engine: measured, not closed
    result = session.result()
    assert result.method is Method.TWO_REQUEST  # neither in-process engine streams
    assert_sane(result, {"32/8": 8, "32/8@2": 8, "gate": 4})
    # the session's vLLM keeps vLLM's default prefix caching; transformers has none
    assert [(m.field, m.flattering) for m in result.mismatches] == [("prefix_cache", False)]
    assert result.to_json()["rungs"][0]["ratio"]["decode_tok_s"]["median"] > 0


def test_hf_against_hf_is_matched_and_bf16_flatters():
    ref, cand = hf_engine(), hf_engine()
    session = SpeedSession(small_ladder(), 4, gate_inputs(ref), {"reference": ref, "candidate": cand}, RULES)
    session.measure("candidate", cand)
    session.measure("reference", ref)
    result = session.result()
    assert_sane(result, {"32/8": 8, "32/8@2": 8, "gate": 4})
    assert result.matched, result.mismatches
    low = ArmMeasurement("hf", hf_engine("bfloat16").speed_settings(), False, {})
    (m,), _ = check_matched(ArmMeasurement("hf", ref.speed_settings(), False, {}), low, ())
    assert (m.field, m.flattering) == ("dtype", True)


def test_eager_reference_against_compiled_vllm_is_flagged_flattering():
    need("transformers")
    from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions

    compiled = VLLMEngine(VLLMOptions(**{**VLLM_OPTIONS, "enforce_eager": None}), base_dir=ROOT)  # not started
    eager = VLLMEngine(VLLMOptions(**VLLM_OPTIONS), base_dir=ROOT)
    hf = ArmMeasurement("hf", hf_engine().speed_settings(), False, {})
    found, _ = check_matched(hf, ArmMeasurement("vllm", compiled.speed_settings(), False, {}), ())
    m = {m.field: m for m in found}["eager"]
    assert (m.reference, m.candidate, m.flattering) == (True, False, True)
    mismatches, _ = check_matched(hf, ArmMeasurement("vllm", eager.speed_settings(), False, {}), ())
    assert [m.field for m in mismatches] == ["prefix_cache"]  # eager both: only vLLM's default prefix cache


@pytest.mark.vllm
def test_bench_cli_on_the_shipped_speed_gate(tmp_path):
    need("vllm")
    from strict_gate.cli import app

    gate = ROOT / "gates" / "speed-hf-vs-vllm.toml"
    result = CliRunner().invoke(app, ["bench", str(gate), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "128/32" in result.output and "speed: informational" in result.output
    (written,) = tmp_path.glob("speed-hf-vs-vllm-*/speed.json")  # a fresh, timestamped directory
    data = json.loads(written.read_text())
    cfg = load_gate_config(gate)
    assert data["method"] == "two-request" and data["matched"] is True and data["runs"] == speed_of(cfg).runs
    assert [r["name"] for r in data["rungs"]] == ["128/32", "128/32@4", "384/32", "384/32@4", "gate"]
    assert all(r["error"] is None and r["candidate"]["tokens"] == r["max_tokens"] for r in data["rungs"])
    assert all(r["token_check"]["verified"] is True for r in data["rungs"])  # hf's timed tokens are vLLM's
    assert data["speed_verdict"]["reasons"] == []


@pytest.mark.vllm
def test_demo_gate_with_speed_shows_the_section_and_keeps_its_token_verdict(tmp_path):
    """The bundled demo gate (recorded vLLM baseline, hf bf16 candidate) with a `[speed]` table
    added: its live [rescorer] (vLLM, the same model) is timed as the speed reference; the token
    verdict is the demo's own (fail, exit 1) and every report carries the speed section, whose
    verdict is not comparable: a bf16 candidate against an fp32 reference flatters the ratio."""
    need("vllm")
    need("transformers")
    from strict_gate.cli import app

    demo = (ROOT / "gates" / "demo.toml").read_text()
    demo = demo.replace('"../', f'"{ROOT}/')
    config = tmp_path / "demo-speed.toml"
    config.write_text(demo + '\n[speed]\nwarmup = 0\nruns = 2\nrungs = ["32/8"]\nconcurrency = [1]\n'
                      'min_speed_ratio = { decode = 0.0001 }\n')
    result = CliRunner().invoke(app, ["gate", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output  # bf16 flips: the token verdict wins, speed never changes it
    (report_dir,) = (tmp_path / "out").glob("demo-hf-bf16-vs-vllm-fp32*/")
    data = json.loads((report_dir / "report.json").read_text())
    assert data["verdict"] == "fail"
    speed = section(data, "speed")
    assert [r["name"] for r in speed["rungs"]] == ["32/8"]
    rung = speed["rungs"][0]
    assert rung["error"] is None and rung["reference"]["tokens"] == rung["candidate"]["tokens"] == 8
    assert rung["ratio"]["decode_tok_s"]["median"] > 0 and speed["verdict"] == "not_comparable"
    assert speed["speed_verdict"]["reasons"][0].startswith("not comparable: dtype (the candidate computes in a "
                                                           "narrower dtype; reference 'float32', candidate 'bfloat16')")
    assert any("rescorer" in n for n in speed["notes"]), speed["notes"]
    md = (report_dir / "report.md").read_text()
    assert "## Speed" in md and "speed: not comparable" in md
    assert "speed" in (report_dir / "report.html").read_text()
    assert 'name="speed"' in (report_dir / "junit.xml").read_text()
