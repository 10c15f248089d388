"""[invariance] state_boundaries: the key's expansion and its refusals (exit 2 with file and line),
hf's chunked prefill against its whole prefill, and a real gate on the tiny Kimi-Linear with both
arms. The hostile engines are in test_adversarial_state_boundaries.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import section, write_gate

from strict_gate.errors import ConfigError
from strict_gate.gate.config import load_gate_config
from strict_gate.invariance.config import of

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KIMI = REPO / "examples" / "models" / "tiny-kimi-linear"
KDA_ENGINE = REPO / "examples" / "engines" / "kda_engine.py"
CMD = {"kind": "command", "command": ["python", str(HERE / "engines" / "variant_engine.py")]}
CUTS = ["prefill-cut-16", "prefill-cut-32", "prefill-cut-63", "prefill-cut-64", "prefill-cut-65"]
HITS = ["prefix-off-63", "prefix-at-64", "prefix-off-65"]


def _prompts(where: Path, n: int = 3, length: int = 70) -> str:
    """Token-id prompts longer than 66 tokens (every cut and hit lands inside them), ids 4..1003."""
    path = where / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [(7 * i + 13 * j) % 1000 + 4
                                                                      for j in range(length + 2 * i)]}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return str(path)


def _line(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(key))


def _load(tmp_path: Path, invariance: dict, reference: dict | None = None, candidate: dict | None = None):
    path = write_gate(tmp_path, prompts=_prompts(tmp_path), reference=reference or CMD, candidate=candidate or CMD,
                      invariance=invariance)
    return path, load_gate_config(path)


def _refused(tmp_path: Path, invariance: dict, reference: dict | None = None, candidate: dict | None = None):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, invariance, reference, candidate)
    return e.value


# -- the key and its expansion


def test_true_reads_the_chunk_from_a_kimi_linear_config(tmp_path):
    """The reference's model directory says kimi_linear (KDA layers): its kernel chunk is 64."""
    _, cfg = _load(tmp_path, {"state_boundaries": True}, reference={"kind": "hf", "model": str(KIMI)})
    assert [v.name for v in of(cfg).variants] == CUTS + HITS


def test_a_number_is_the_chunk_and_state_block_places_the_hits(tmp_path):
    _, cfg = _load(tmp_path, {"state_boundaries": 8, "state_block": 16, "chunked_prefill": [8]})
    names = [v.name for v in of(cfg).variants]
    assert names == ["chunked_prefill-8", "prefill-cut-2", "prefill-cut-4", "prefill-cut-7", "prefill-cut-8",
                     "prefill-cut-9", "prefix-off-15", "prefix-at-16", "prefix-off-17"]
    sizes = {v.name: (str(v.kind), v.size) for v in of(cfg).variants}
    assert sizes["prefill-cut-7"] == ("chunked_prefill", 7) and sizes["prefix-at-16"] == ("prefix_cache", 16)


def test_the_hits_are_planned_only_on_an_arm_that_serves_a_prefix_cache(tmp_path):
    """hf has no prefix cache: its hits are neither refused nor planned (an interrupt names no run
    that will never be made); the command arm, whose hello decides at start, keeps them."""
    from strict_gate.engines.base import PromptInput
    from strict_gate.invariance.run import planned

    _, cfg = _load(tmp_path, {"state_boundaries": True, "arms": ["candidate", "reference"]},
                   reference={"kind": "hf", "model": str(KIMI)})
    inputs = [PromptInput(id="q", token_ids=tuple(range(4, 80)))]
    runs = {(arm, v.name) for arm, v, _ in planned(of(cfg), inputs, tmp_path)}
    assert {n for arm, n in runs if arm == "reference"} == {"baseline", *CUTS}
    assert {n for arm, n in runs if arm == "candidate"} == {"baseline", *CUTS, *HITS}


def test_a_qwen3_next_and_a_mamba2_config_give_their_chunks(tmp_path):
    for model_type, extra, chunk in (("qwen3_next", {"layer_types": ["linear_attention", "full_attention"]}, 64),
                                      ("mamba2", {"chunk_size": 128}, 128)):
        model = tmp_path / model_type
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"model_type": model_type} | extra), encoding="utf-8")
        _, cfg = _load(tmp_path, {"state_boundaries": True}, reference={"kind": "hf", "model": str(model)})
        assert of(cfg).variants[3].name == f"prefill-cut-{chunk}", model_type


def test_a_model_without_recurrent_state_is_refused_at_the_keys_line(tmp_path):
    e = _refused(tmp_path, {"state_boundaries": True}, reference={"kind": "hf", "model": "bundled:tiny-llama"})
    assert "has no recurrent state" in str(e) and "tiny-llama/config.json" in str(e)
    assert "model_type 'llama'" in str(e) and "state_boundaries = 64" in str(e)
    assert e.path == str(tmp_path / "gate.toml") and e.line == _line(tmp_path / "gate.toml", "state_boundaries")


def test_a_recurrent_model_that_names_no_chunk_is_refused(tmp_path):
    model = tmp_path / "mamba"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "mamba"}), encoding="utf-8")
    e = _refused(tmp_path, {"state_boundaries": True}, reference={"kind": "hf", "model": str(model)})
    assert "carries a recurrent state and names no kernel chunk size" in str(e)
    assert e.line == _line(tmp_path / "gate.toml", "state_boundaries")


def test_no_model_directory_to_read_is_refused(tmp_path):
    e = _refused(tmp_path, {"state_boundaries": True})
    assert "no arm names a model directory with a config.json" in str(e)
    assert e.line == _line(tmp_path / "gate.toml", "state_boundaries")


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"state_boundaries": 0}, "state_boundaries", ">= 1"),
    ({"state_boundaries": "64"}, "state_boundaries", "wrong type"),
    ({"batch": [2], "state_block": 64}, "state_block", "state_block without state_boundaries"),
    ({"state_boundaries": 64, "state_block": 0}, "state_block", ">= 1"),
])
def test_a_bad_value_is_refused_at_its_line(tmp_path, table, key, words):
    e = _refused(tmp_path, table)
    assert words in str(e) and e.line == _line(tmp_path / "gate.toml", key), str(e)


def test_an_arm_that_cannot_chunk_its_prefill_is_refused_naming_the_variant(tmp_path):
    """An openai server chunks as it likes: the cuts cannot run on it (the hits are left out, not refused)."""
    server = {"kind": "openai", "base_url": "http://127.0.0.1:9", "tokenizer": str(KIMI)}
    e = _refused(tmp_path, {"state_boundaries": 64}, candidate=server)
    assert "state_boundaries (prefill-cut-16, a chunked_prefill variant) cannot run on the [candidate] arm" in str(e)
    assert e.line == _line(tmp_path / "gate.toml", "state_boundaries")


def test_the_cli_exits_2_naming_file_and_line(tmp_path):
    path, _ = write_gate(tmp_path, prompts=_prompts(tmp_path), reference={"kind": "hf", "model": "bundled:tiny-llama"},
                         candidate=CMD, invariance={"state_boundaries": True}), None
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "invariance", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and f"{path}:{_line(path, 'state_boundaries')}:" in p.stderr, p.stderr


# -- hf's chunked prefill


def test_hf_chunked_prefill_equals_the_whole_prefill_token_for_token():
    """float32 tiny Llama: every chunk size gives the whole prefill's tokens, through as many
    prefill forwards as the chunk makes (counted: a chunk ignored would be one forward)."""
    from strict_gate.engines.base import PromptInput
    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.runs.records import Sampling

    prompts = [PromptInput(id=f"q{i}", token_ids=tuple((11 * i + 5 * j) % 500 + 3 for j in range(37 + i)))
               for i in range(3)]
    sampling = Sampling(max_tokens=8, top_logprobs=3, ignore_eos=True)
    whole = HFEngine(HFOptions(model="bundled:tiny-llama", threads=1))
    want = {r.id: r for r in whole.generate(prompts, sampling)}
    for chunk in (1, 16, 37):
        engine = whole.with_prefill_chunk(chunk)
        engine.start()
        widths: list[int] = []
        engine._model.register_forward_pre_hook(lambda _m, _a, kw, w=widths: w.append(kw["input_ids"].shape[1]),
                                                with_kwargs=True)
        got = {r.id: r for r in engine.generate(prompts, sampling)}
        assert engine.info().options["prefill_chunk"] == chunk  # the run's manifest records it
        for p in prompts:
            assert got[p.id].error is None and got[p.id].token_ids == want[p.id].token_ids, (chunk, p.id)
            for a, b in zip(got[p.id].top_logprobs, want[p.id].top_logprobs, strict=True):
                assert [t for t, _ in a] == [t for t, _ in b]
                assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b, strict=True))
        prefill = [w for w in widths if w > 1] if chunk > 1 else widths[: len(prompts[0].token_ids)]
        expect = [min(chunk, len(prompts[0].token_ids) - s) for s in range(0, len(prompts[0].token_ids), chunk)]
        assert prefill[: len(expect)] == expect, (chunk, widths)


# -- a real gate


def _rel(p: Path, start: Path) -> str:
    return os.path.relpath(p, start)


def test_a_gate_with_state_boundaries_on_both_arms_of_the_tiny_kimi_linear(tmp_path, monkeypatch):
    """hf's reference and the KDA example engine, float32, every cut run on both arms from a working
    directory with relative paths; neither serves a prefix cache, so the hits are left out, named."""
    monkeypatch.chdir(tmp_path)
    _prompts(tmp_path, n=2, length=70)
    model = _rel(KIMI, tmp_path)
    write_gate(tmp_path, name="kda-boundaries", prompts="p.jsonl", max_tokens=2, top_logprobs=2, output_dir="out",
               reference={"kind": "hf", "model": model, "dtype": "float32", "threads": 1},
               candidate={"kind": "command", "model": model, "tokenizer": model,
                          "command": [sys.executable, _rel(KDA_ENGINE, tmp_path), "--model", model,
                                      "--dtype", "float32", "--threads", "1"],
                          "env": {"DEVICE_KDA": "1", "KDA_CHUNK_PREFILL": "1"}},
               invariance={"arms": ["candidate", "reference"], "state_boundaries": True, "policy": "strict"})
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", "gate.toml"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (report,) = [json.loads(f.read_text()) for f in Path("out").glob("*/report.json")]
    inv = section(report, "invariance")
    assert inv["config"]["variants"] == CUTS + HITS
    assert inv["config"]["not_served"] == {"candidate": HITS, "reference": HITS}
    verdicts = {(v["arm"], v["name"]): v["verdict"] for v in inv["variants"]}
    assert verdicts == {(arm, n): "pass" for arm in ("candidate", "reference") for n in CUTS}
    run = next(Path("out").glob("*/invariance/reference/prefill-cut-63"))
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["engine"]["options"]["prefill_chunk"] == 63
    assert manifest["engine"]["options"]["invariance_variant"] == "prefill-cut-63"
