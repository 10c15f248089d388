"""The C++ example engine's dump (examples/engines/cpp/dump.hpp): the points, grafting, the decode
path, and a decode-only KV-cache bug localised to its layer and op (issue 27).

Real binary (built by the conftest fixture from this checkout), real model (the bundled
tiny-llama), real transformers for the names. The planted bug is in the binary itself, off unless
STRICT_GATE_CPP_KV_BUG=LAYER:STEP is set: from decode step STEP on (step 1 is the first id after
the prompt's prefill) layer LAYER's cached key at position 0 is zeroed, so prefill, score and a
prefill dump stay honest while the generated tokens diverge.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import need

from strict_gate.check_engine import check_engine, load_engine_arm
from strict_gate.engines.base import DumpRequest
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.localize.capture import capture
from strict_gate.localize.compare import point_diff
from strict_gate.localize.points import ops_of

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
LAYER, STEP = 1, 2
_FIRST = json.loads((ROOT / "baselines/tiny-llama-vllm-fp32/records.jsonl").read_text(encoding="utf-8").split("\n")[0])
IDS = tuple(_FIRST["prompt_token_ids"] + _FIRST["token_ids"][:6])  # a prompt and its continuation
ALL_POINTS = ("embed", *ops_of(0), *ops_of(1), "norm", "logits")


def cpp(binary: Path, *args: str, env: dict[str, str] | None = None) -> CommandEngine:
    return CommandEngine(CommandOptions(command=[str(binary), "--model", str(MODEL), *args], timeout_s=60), env=env,
                         base_dir=ROOT)


EVERY = tuple(range(len(IDS)))


def dumped(engine, where: Path, points=ALL_POINTS, positions=EVERY, **kw) -> dict:
    return capture(engine, DumpRequest(IDS, points, positions, where, **kw)).tensors


@pytest.mark.slow
@pytest.mark.parametrize(("args", "decode_from"), [((), None), (("--prefill", "stepwise"), None), ((), 5)])
def test_every_point_is_the_transformers_module_of_that_name(binary, tmp_path, args, decode_from):
    """Every name hf gives on the bundled Llama, the C++ engine gives, within the float32 tolerance:
    q/k/v before rotary, `attn` before the residual add, `mlp.act` down_proj's input, ..."""
    need("transformers")
    from strict_gate.engines.hf import HFEngine, HFOptions

    hf = HFEngine(HFOptions(model=str(MODEL)))
    engine = cpp(binary, *args)
    try:
        ref = dumped(hf, tmp_path / "hf", decode_from=decode_from)
        got = dumped(engine, tmp_path / "cpp", decode_from=decode_from)
    finally:
        hf.close()
        engine.close()
    assert sorted(got) == sorted(ref) and len(got) == 3 + 2 * 16  # embed, norm, logits; 16 a layer (no KDA, MoE)
    diffs = {name: point_diff(name, ref[name], got[name], 1e-10) for name in ref}
    assert not [d for d in diffs.values() if d.beyond], [(d.name, d.rel_diff) for d in diffs.values()]


def test_graft_feeds_the_layer_inputs_and_the_decode_path_takes_the_cache(binary, tmp_path):
    from safetensors.torch import save_file

    engine = cpp(binary)
    planted = cpp(binary, env={"STRICT_GATE_CPP_KV_BUG": f"{LAYER}:{STEP}"})
    try:
        own = dumped(engine, tmp_path / "own")
        save_file({"layers.0": own["layers.0"] * 2}, str(tmp_path / "graft.safetensors"))
        grafted = dumped(engine, tmp_path / "grafted", graft=tmp_path / "graft.safetensors")
        decoded = dumped(engine, tmp_path / "decoded", decode_from=4)
        bug_prefill = dumped(planted, tmp_path / "bug-prefill")
        bug_decode = dumped(planted, tmp_path / "bug-decode", decode_from=4)
    finally:
        engine.close()
        planted.close()
    # layer 1 is fed 2 x layer 0's output; layer 0 (fed its own embed) is untouched
    assert bool((grafted["layers.0"] == own["layers.0"]).all()) and bool((grafted["embed"] == own["embed"]).all())
    assert not bool((grafted["layers.1"] == own["layers.1"]).all())
    # the honest decode path: the prompt path's numbers up to summation order
    assert all(not point_diff(k, own[k], decoded[k], 1e-10).beyond for k in own)
    # the planted bug: its prefill is the honest one, bit for bit; its decode path differs from
    # decode step STEP on (position 4 + STEP - 1), first in layer LAYER's attention core
    assert all(bool((bug_prefill[k] == own[k]).all()) for k in own)
    first = 4 + STEP - 1
    untouched = {"embed", *(k for k in own if k.startswith("layers.0")),
                 *(f"layers.1.{o}" for o in ("attn_norm", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.q_rope",
                                             "attn.k_rope"))}
    for k in own:
        assert bool((bug_decode[k][:first] == decoded[k][:first]).all()), k
        assert bool((bug_decode[k][first:] == decoded[k][first:]).all()) == (k in untouched), k


def test_bad_dump_requests_are_error_replies_and_the_engine_serves_on(binary, tmp_path):
    proc = subprocess.Popen([str(binary), "--model", str(MODEL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    assert {"dump", "graft", "dump_decode"} <= set(json.loads(proc.stdout.readline())["capabilities"])
    (tmp_path / "notst").write_text("not safetensors")
    base: dict[str, object] = {"op": "dump", "id": "d", "prompt_token_ids": [1, 2, 3], "positions": [1, 2],
                               "directory": str(tmp_path)}
    bad: list[tuple[dict[str, object], str]] = [
        ({"positions": [3]}, "not an index below 3"), ({"positions": []}, "non-empty"),
        ({"points": "embed"}, "list of point names"), ({"directory": 5}, "\"directory\""),
        ({"mode": "fast"}, "\"mode\""), ({"mode": "decode"}, "decode_from"),
        ({"mode": "decode", "decode_from": 4}, "decode_from"),
        ({"mode": "decode", "decode_from": 2, "graft": str(tmp_path / "notst")}, "cannot graft"),
        ({"graft": str(tmp_path / "notst")}, "\"graft\": "), ({"graft": str(tmp_path / "none")}, "cannot open"),
        ({"directory": str(tmp_path / "missing")}, "cannot write"), ({"prompt_token_ids": [1, 5000]}, "vocabulary")]
    for change, why in bad:
        proc.stdin.write(json.dumps(base | change) + "\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline())
        assert set(reply) == {"id", "error"} and why in reply["error"], (change, reply)
    assert not list(tmp_path.glob("*.safetensors*"))  # nothing half-written left behind
    proc.stdin.write(json.dumps(base | {"points": ["layers.1.mlp.act", "layers.7", "attn", "logits"]}) + "\n")
    proc.stdin.flush()
    reply = json.loads(proc.stdout.readline())
    assert reply["points"] == ["layers.1.mlp.act", "logits"]  # what it cannot give is left out
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_check_engine_passes_the_dump_graft_and_dump_decode_checks_of_the_shipped_gate(binary, tmp_path):
    checklist = check_engine(load_engine_arm(ROOT / "gates" / "cpp-f32.toml"), log_dir=tmp_path)
    got = {c.name: c.status.value for c in checklist.checks}
    assert got["dump"] == got["graft"] == got["dump_decode"] == "pass" and checklist.exit_code == 0, checklist.lines()


GATE = """name = "cpp-kv-bug"
prompts = "prompts.jsonl"
max_tokens = 16
top_logprobs = 5
policy = "strict"
output_dir = "reports"
localize = "all"

[reference]
kind = "command"
command = ["engine", "--model", "tiny-llama"]
tokenizer = "tiny-llama"
model = "cpp:tiny-llama-f32"

[candidate]
kind = "command"
command = ["engine", "--model", "tiny-llama"]
tokenizer = "tiny-llama"
model = "cpp:tiny-llama-f32-kv-bug"
env = { STRICT_GATE_CPP_KV_BUG = "LAYER:STEP" }
"""


@pytest.mark.slow
def test_a_decode_only_kv_cache_bug_is_localised_along_the_decode_path(binary, tmp_path, monkeypatch):
    """The honest binary against itself with the bug planted, gated as a user gates it (relative
    paths, output_dir "reports"): every divergent prompt's candidate prefill dump picks the
    reference's token, so its decode-path dump is compared, and names layers.LAYER.attn, narrowed
    to the attention core (the cached keys live there; q/k/v of the new id are still right)."""
    monkeypatch.chdir(tmp_path)
    os.symlink(binary, "engine")
    os.symlink(MODEL, "tiny-llama")
    lines = (ROOT / "prompts" / "battery-128.jsonl").read_text(encoding="utf-8").splitlines()
    Path("prompts.jsonl").write_text("\n".join(lines[:24]) + "\n", encoding="utf-8")
    Path("gate.toml").write_text(GATE.replace("LAYER:STEP", f"{LAYER}:{STEP}"), encoding="utf-8")
    result = run_gate(load_gate_config(Path("gate.toml")))
    assert result.report_dir.resolve().parent == (tmp_path / "reports").resolve()
    report = json.loads((result.report_dir / "report.json").read_text(encoding="utf-8"))
    localised = [p for p in report["prompts"] if p.get("localization")]
    assert any(p["status"] == "divergent" for p in localised), "the planted bug changed no token: nothing to localise"
    assert {p["id"] for p in localised} == {p["id"] for p in report["prompts"] if p["status"] != "match"}
    for p in localised:
        loc = p["localization"]
        assert loc["error"] is None, loc["error"]
        arms = {r["arm"]: r for r in loc["reproduction"]}
        # the candidate is compared along its decode path: the hf reference dumps along its decode path too
        assert arms["reference"]["path"] == "decode" and arms["reference"]["reproduced"], arms
        assert arms["candidate"]["path"] == "decode" and arms["candidate"]["reproduced"], arms
        assert loc["first_beyond"] == f"layers.{LAYER}.attn", [(q["name"], q["rel_diff"]) for q in loc["points"]]
        assert loc["first_beyond_op"] == f"layers.{LAYER}.attn.core", loc["ops"]
    md = (result.report_dir / "report.md").read_text(encoding="utf-8")
    # the example engine grafts layer inputs but not at ops: the op is named, its graft verdict says why not
    assert md.count(f"| layers.{LAYER}.attn → layers.{LAYER}.attn.core (not grafted: the candidate cannot graft at "
                    "ops (no graft_ops)) |") == len(localised)
    assert md.count("candidate yes (decode)") == len(localised)
    # the prefill dump the decode path replaced: the candidate's own picks the reference's token at
    # the divergence (its prefill is honest), so comparing it would have localised nothing
    p = localised[0]
    at = p["first_divergence"]["position"]
    records = (result.report_dir / "reference" / "records.jsonl").read_text(encoding="utf-8").splitlines()
    ref = next(r for r in map(json.loads, records) if r and r["id"] == p["id"])
    ids = tuple(ref["prompt_token_ids"] + ref["token_ids"][: at + 1])
    planted = cpp(binary, env={"STRICT_GATE_CPP_KV_BUG": f"{LAYER}:{STEP}"})
    try:
        logits = capture(planted, DumpRequest(ids, ("logits",), (len(ids) - 2,), tmp_path / "prefill")).tensors
    finally:
        planted.close()
    assert int(logits["logits"][0].argmax()) == ref["token_ids"][at] == p["first_divergence"]["reference_token"]
