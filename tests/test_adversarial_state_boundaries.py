"""state_boundaries against hostile engines: real processes (tests/engines/variant_engine.py) over
the command protocol, driven by `strict-gate invariance`.

An engine whose tokens move only at exactly the chunk (a state-carry bug at the kernel's
boundary) fails the one cut and the one hit that land there, and nothing a token either side; an
engine that claims prefill_chunk and ignores it passes (tokens cannot tell), but the gate is shown
to have asked for every cut and served every warm-up prefix; an engine that declares no chunk or
no cache, or prompts too short for a cut, never read as a pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import write_gate

HERE = Path(__file__).resolve().parent
ENGINE = str(HERE / "engines" / "variant_engine.py")
CUTS = ["prefill-cut-16", "prefill-cut-32", "prefill-cut-63", "prefill-cut-64", "prefill-cut-65"]
HITS = ["prefix-off-63", "prefix-at-64", "prefix-off-65"]


def _gate(tmp_path: Path, *flags: str, length: int = 70, arms: tuple[str, ...] = ("candidate", "reference")) -> Path:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [(5 * i + 3 * j) % 900 + 4
                                                                        for j in range(length + i)]}) + "\n"
                               for i in range(3)), encoding="utf-8")
    cand = {"kind": "command", "command": ["python", ENGINE, "--tag", "cand", *flags], "timeout_s": 10.0}
    ref = {"kind": "command", "command": ["python", ENGINE, "--tag", "ref"], "timeout_s": 10.0}
    return write_gate(tmp_path, prompts=str(prompts), max_tokens=4, top_logprobs=2,
                      output_dir=str(tmp_path / "out"), reference=ref, candidate=cand,
                      invariance={"arms": list(arms), "state_boundaries": 64, "policy": "strict"})


def _cli(tmp_path: Path, path: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "200", "VARIANT_ENGINE_REQUESTS": str(tmp_path / "requests.log")}
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", "invariance", str(path)], capture_output=True,
                          text=True, timeout=300, env=env)


def _result(tmp_path: Path) -> dict:
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/invariance.json")]
    return doc["invariance"]


def _verdicts(inv: dict, arm: str = "candidate") -> dict[str, str]:
    return {v["name"]: v["verdict"] for v in inv["variants"] if v["arm"] == arm}


def _requests(tmp_path: Path, tag: str = "cand") -> list[list[str]]:
    lines = (tmp_path / "requests.log").read_text().splitlines()
    return [line.split()[1:] for line in lines if line.split()[0] == tag]


def test_tokens_that_move_only_at_the_chunk_boundary_fail_that_cut_and_that_hit_alone(tmp_path):
    """The bug lives at exactly 64: prefill-cut-64 and prefix-at-64 fail, the cuts and hits one
    token either side pass (each hit on a fresh engine: on a shared one the 64-token warm-up of
    prefix-at-64 would still be cached for prefix-off-65), and the reference arm passes all."""
    p = _cli(tmp_path, _gate(tmp_path, "--mode", "boundary", "--at", "64"))
    assert p.returncode == 5, p.stdout + p.stderr
    inv = _result(tmp_path)
    assert _verdicts(inv) == {n: "fail" if n in ("prefill-cut-64", "prefix-at-64") else "pass" for n in CUTS + HITS}
    assert _verdicts(inv, "reference") == {n: "pass" for n in CUTS + HITS}
    moved = next(v for v in inv["variants"] if v["arm"] == "candidate" and v["name"] == "prefill-cut-64")
    assert {m["position"] for m in moved["divergences"]} == {2} and len(moved["divergences"]) == 3
    assert moved["divergences"][0]["label"] == "prefill-chunk dependence"
    hit = next(v for v in inv["variants"] if v["arm"] == "candidate" and v["name"] == "prefix-at-64")
    assert hit["divergences"][0]["label"] == "prefix-cache dependence"
    assert "NOT INVARIANT (candidate:prefill-cut-64, candidate:prefix-at-64)" in p.stdout


def test_an_engine_that_ignores_the_chunk_passes_and_the_gate_asked_for_every_cut_and_prefix(tmp_path):
    """Tokens cannot tell an ignored chunk from an honoured one: what the gate can show is that it
    asked, each cut carried on every request of its variant, each hit's warm-up prefix served first."""
    p = _cli(tmp_path, _gate(tmp_path, "--mode", "invariant", arms=("candidate",)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _verdicts(_result(tmp_path)) == {n: "pass" for n in CUTS + HITS}
    reqs = _requests(tmp_path)
    for n in (16, 32, 63, 64, 65):
        assert sum(1 for r in reqs if r[-1] == f"chunk{n}") == 3, n
    warm = [r[1] for r in reqs if r[0] == "generate" and r[1].endswith("~prefix")]
    assert len(warm) == 9  # 3 hits x 3 prompts
    assert sum(1 for r in reqs if r[0] == "start") == 1 + len(CUTS) + len(HITS)  # a fresh engine per cut and hit
    manifests = {d.name: json.loads((d / "manifest.json").read_text())["engine"]["options"]
                 for d in (tmp_path / "out").glob("*/invariance/candidate/*") if (d / "manifest.json").exists()}
    assert manifests["prefill-cut-63"]["prefill_chunk"] == 63 and manifests["prefix-at-64"]["cached_prefix"] == 64
    assert "prefill_chunk" not in manifests["baseline"] and "cached_prefix" not in manifests["prefill-cut-63"]


def test_an_engine_that_declares_no_prefill_chunk_is_incomplete_never_a_pass(tmp_path):
    p = _cli(tmp_path, _gate(tmp_path, "--no-chunk", "--no-cache", arms=("candidate",)))
    assert p.returncode == 3, p.stdout + p.stderr
    inv = _result(tmp_path)
    assert _verdicts(inv) == {n: "incomplete" for n in CUTS}
    v = next(v for v in inv["variants"] if v["name"] == "prefill-cut-63")
    assert "serves chunked_prefill" in " ".join(v["problems"]), v["problems"]
    assert inv["config"]["not_served"] == {"candidate": HITS}


def test_an_engine_without_a_prefix_cache_leaves_the_hits_out_and_says_so(tmp_path):
    """Its hello says no prefix cache: the hits are not run (nor counted), the cuts are."""
    p = _cli(tmp_path, _gate(tmp_path, "--mode", "boundary", "--no-cache", arms=("candidate",)))
    assert p.returncode == 5, p.stdout + p.stderr
    inv = _result(tmp_path)
    assert _verdicts(inv) == {n: "fail" if n == "prefill-cut-64" else "pass" for n in CUTS}
    assert inv["config"]["not_served"] == {"candidate": HITS}
    assert not any(r[1].endswith("~prefix") for r in _requests(tmp_path) if r[0] == "generate")
    assert sum(1 for r in _requests(tmp_path) if r[0] == "start") == 1 + len(CUTS)  # no engine started for a hit


def test_prompts_too_short_for_a_cut_leave_it_unexercised_never_a_pass(tmp_path):
    """Prompts of 63 to 65 tokens: the cut at 65 and the 65-token hit are followed by nothing. Was
    each a pass whatever the engine did at the boundary; those at 64 still catch the bug."""
    p = _cli(tmp_path, _gate(tmp_path, "--mode", "boundary", length=63, arms=("candidate",)))
    assert p.returncode == 3, p.stdout + p.stderr
    inv = _result(tmp_path)
    v = _verdicts(inv)
    assert {n for n, x in v.items() if x == "incomplete"} == {"prefill-cut-65", "prefix-off-65"}
    assert v["prefill-cut-64"] == v["prefix-at-64"] == "fail"  # the 65-token prompt is cut at 64
    short = next(x for x in inv["variants"] if x["name"] == "prefix-off-65")
    assert "no prompt is longer than 65 tokens (the longest has 65)" in short["problems"][0]
