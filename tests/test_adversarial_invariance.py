"""Hostile and batch-dependent engines against [invariance], end to end through the CLI.

Every engine is a real process (tests/engines/variant_engine.py) speaking the command protocol
with `max_in_flight`, `prefill_chunk` and `prefix_cache`: one whose tokens change when more
than one request is in flight, one whose tokens change with the prefill chunk, one with a
prefix cache that changes them, and ones that break the in-flight rules (a reply for an id
never sent, a second reply for one id, a declared max_in_flight it then does not serve). A
batch-invariant engine passes. No mock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import section, write_gate

HERE = Path(__file__).resolve().parent
ENGINE = str(HERE / "engines" / "variant_engine.py")
EVERY = {"batch": [1, 4], "concurrency": [3], "chunked_prefill": [0, 2], "prefix_cache": True, "needle": True}


def _gate(tmp_path: Path, mode: str, invariance: dict, *, extra: tuple[str, ...] = (), **top) -> Path:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]}) + "\n"
                               for i in range(6)), encoding="utf-8")
    arm = {"kind": "command", "command": ["python", ENGINE, "--mode", mode, *extra], "timeout_s": 5.0}
    reference = {"kind": "command", "command": ["python", ENGINE]}
    return write_gate(tmp_path, prompts=str(prompts), max_tokens=4, top_logprobs=2, output_dir=str(tmp_path / "out"),
                      reference=reference, candidate=arm, invariance={"policy": "strict"} | invariance, **top)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"COLUMNS": "200"})


def _variants(tmp_path: Path, file: str = "invariance.json") -> dict[str, dict]:
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob(f"*/{file}")]
    return {v["name"]: v for v in doc["invariance"]["variants"]}


def test_a_batch_invariant_engine_passes_every_variant(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "invariant", EVERY | {"repeats": 2})))
    assert p.returncode == 0, p.stdout + p.stderr
    variants = _variants(tmp_path)
    assert set(variants) == {"batch-1", "batch-4", "concurrency-3", "chunked_prefill-0", "chunked_prefill-2",
                             "prefix_cache", "needle"}
    assert all(v["verdict"] == "pass" and v["prompts_exact"] == 6 and v["distinct_outputs"] == 1
               and len(v["runs"]) == 2 for v in variants.values())
    assert "INVARIANT, policy strict" in p.stdout


def test_tokens_that_move_with_requests_in_flight_fail_naming_the_variants(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "in_flight", EVERY)))
    assert p.returncode == 5, p.stdout + p.stderr
    v = _variants(tmp_path)
    moved = {n for n, x in v.items() if x["verdict"] == "fail"}
    assert moved == {"batch-4", "concurrency-3", "needle"}
    assert v["batch-1"]["verdict"] == v["chunked_prefill-2"]["verdict"] == v["prefix_cache"]["verdict"] == "pass"
    d = v["concurrency-3"]["divergences"][0]
    assert (d["position"], d["label"]) == (2, "batch dependence")  # a 3-nat flip: beyond the band
    assert "NOT INVARIANT (batch-4, concurrency-3, needle)" in p.stdout


def test_tokens_that_move_with_the_prefill_chunk_fail_naming_the_variant(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "chunk", {"chunked_prefill": [0, 2], "batch": [4]})))
    assert p.returncode == 5, p.stdout + p.stderr
    v = _variants(tmp_path)
    assert {n: x["verdict"] for n, x in v.items()} == {
        "batch-4": "pass", "chunked_prefill-0": "pass", "chunked_prefill-2": "fail"}
    assert v["chunked_prefill-2"]["prompts_exact"] == 0


def test_a_near_tie_flip_passes_the_near_tie_policy_only(tmp_path):
    """A 0.1-nat flip at position 2 under requests in flight, then the batch-1 model's argmax on
    the variant's own prefix: the arm's engine, restarted to re-score, judges both later tokens."""
    gate = _gate(tmp_path, "in_flight", {"batch": [4], "policy": "near-tie"}, extra=("--gap", "0.1", "--score"))
    p = _cli("invariance", str(gate))
    assert p.returncode == 0, p.stdout + p.stderr
    d = _variants(tmp_path)["batch-4"]["divergences"][0]
    assert d["label"] == "batch-variant near-tie" and "1/1 later position(s) judged" in d["reason"]
    assert list((tmp_path / "out").glob("*/invariance/candidate/rescore/engine.log"))  # the re-scoring engine's log


def test_a_near_tie_flip_then_garbage_fails_the_near_tie_policy(tmp_path):
    """The same flip, then a token the batch-1 model ranks nowhere: the first divergence alone
    is a near-tie, what follows it is not, and the variant fails (exit 5)."""
    gate = _gate(tmp_path, "in_flight", {"batch": [4], "policy": "near-tie"},
                 extra=("--gap", "0.1", "--score", "--garbage"))
    p = _cli("invariance", str(gate))
    assert p.returncode == 5, p.stdout + p.stderr  # before: exit 0, judged at its first divergence only
    v = _variants(tmp_path)["batch-4"]
    assert v["verdict"] == "fail"
    assert v["divergences"][0]["reason"].startswith("divergent after a near-tie: later position 3")


def test_a_near_tie_flip_an_engine_cannot_rescore_is_incomplete(tmp_path):
    """Without a score op nothing judges the tokens after the flip: never a pass (exit 3)."""
    gate = _gate(tmp_path, "in_flight", {"batch": [4], "policy": "near-tie"}, extra=("--gap", "0.1"))
    p = _cli("invariance", str(gate))
    assert p.returncode == 3, p.stdout + p.stderr  # before: exit 0
    v = _variants(tmp_path)["batch-4"]
    assert v["verdict"] == "incomplete" and any("position 3 after the flip not judged" in x for x in v["problems"])


def test_tokens_that_move_on_a_prefix_cache_hit_fail(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "cache", {"prefix_cache": True})))
    assert p.returncode == 5, p.stdout + p.stderr
    assert _variants(tmp_path)["prefix_cache"]["verdict"] == "fail"


@pytest.mark.parametrize(("mode", "rule"), [
    ("stray_id", "a reply for id 'never-sent': no request with that id is in flight"),
    ("extra", "it was answered already (more replies than requests)"),
    ("refuse", "rule: an engine whose hello declares max_in_flight = 8 answers while that many are outstanding"),
])
def test_an_engine_that_breaks_the_in_flight_rules_fails_naming_the_rule(tmp_path, mode, rule):
    p = _cli("invariance", str(_gate(tmp_path, mode, {"batch": [4]})))
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variants(tmp_path)["batch-4"]
    assert v["verdict"] == "incomplete" and any(rule in x for x in v["problems"]), v["problems"]
    assert len(v["problems"]) == 1  # the engine failure, said once (not again as "the run failed")
    (run,) = v["runs"]
    manifest = json.loads((Path(run) / "manifest.json").read_text())
    assert manifest["status"] == "failed" and rule.split(":")[0] in manifest["error"]


def test_a_variant_the_hello_does_not_declare_is_not_run(tmp_path):
    """max_in_flight 1, no prefill_chunk capability, no prefix cache: the kind may serve the
    variants, this binary does not; each is incomplete (exit 3), its reason named."""
    gate = _gate(tmp_path, "invariant", {"batch": [4], "chunked_prefill": [2], "prefix_cache": True},
                 extra=("--max-in-flight", "1", "--no-chunk", "--no-cache"))
    p = _cli("invariance", str(gate))
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variants(tmp_path)
    for name, serving in (("batch-4", "batch"), ("chunked_prefill-2", "chunked_prefill"),
                          ("prefix_cache", "prefix_cache")):
        assert f"needs an engine that serves {serving}; this command engine, once started, serves none of them" \
            in " ".join(v[name]["problems"]), v[name]["problems"]


def test_in_a_gate_the_token_verdict_passes_and_invariance_exits_5(tmp_path):
    """The gate's arms agree (both batch-1), the candidate moves at batch 4: exit 5, report.json
    holds both verdicts, junit.xml a failing invariance case, report.md the table."""
    p = _cli("gate", str(_gate(tmp_path, "in_flight", {"batch": [4]}, policy="strict")))
    assert p.returncode == 5, p.stdout + p.stderr
    (report,) = (tmp_path / "out").glob("*/report.json")
    doc = json.loads(report.read_text())
    assert doc["verdict"] == "pass" and section(doc, "invariance")["verdict"] == "fail"
    assert section(doc, "invariance")["variants"][0]["name"] == "batch-4"
    junit = (report.parent / "junit.xml").read_text()
    assert 'name="invariance candidate batch-4"' in junit and "<failure" in junit
    assert "## Invariance" in (report.parent / "report.md").read_text()
    assert "<h2 id='invariance'>" in (report.parent / "report.html").read_text()
    assert (report.parent / "invariance" / "candidate" / "batch-4" / "records.jsonl").exists()


def test_in_a_gate_a_token_failure_wins(tmp_path):
    """The candidate differs from the reference at batch 1 (policy strict) and moves at batch 4:
    exit 1, the token verdict's, whatever invariance says."""
    p = _cli("gate", str(_gate(tmp_path, "in_flight", {"batch": [4]}, extra=("--shift", "1"), policy="strict")))
    assert p.returncode == 1, p.stdout + p.stderr
    (report,) = (tmp_path / "out").glob("*/report.json")
    doc = json.loads(report.read_text())
    assert doc["verdict"] == "fail" and section(doc, "invariance")["verdict"] == "fail" and section(doc, "invariance")["exit_code"] == 5


def test_a_bad_max_in_flight_in_the_hello_is_an_engine_failure(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "invariant", {"batch": [4]}, extra=("--max-in-flight", "0"))))
    assert p.returncode == 3, p.stdout + p.stderr
    (problem,) = _variants(tmp_path)["batch-4"]["problems"]
    assert 'hello "max_in_flight" must be an integer >= 1, got 0' in problem


def test_an_openai_server_under_concurrent_requests(fake_openai, tmp_path):
    """A real HTTP server on 127.0.0.1 (the tests' fake, stopped after): concurrency 3 keeps
    three requests in flight from the client (a sliding window; the server may serve them in
    turn); its tokens depend on the prompt alone: pass."""
    fast = {"retries": 0, "request_timeout_s": 10.0}
    url = fake_openai().url
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [1, 2 + i, 3]}) + "\n" for i in range(7)))
    gate = write_gate(tmp_path, prompts=str(prompts), max_tokens=2, top_logprobs=2, output_dir=str(tmp_path / "out"),
                      reference={"kind": "openai", "base_url": url, **fast},
                      candidate={"kind": "openai", "base_url": url, **fast},
                      invariance={"concurrency": [3], "batch": [4], "policy": "strict"})
    p = _cli("invariance", str(gate))
    assert p.returncode == 0, p.stdout + p.stderr
    v = _variants(tmp_path)
    assert v["concurrency-3"]["verdict"] == v["batch-4"]["verdict"] == "pass"
    assert v["concurrency-3"]["prompts_exact"] == 7


# ---------------------------------------------------------------------------- issue 26, item 19: the console table


@pytest.mark.parametrize("arms", [("candidate",), ("candidate", "reference")])
def test_the_console_table_never_cuts_a_figure_at_80_columns(arms):
    """128 prompts of 128 tokens over three variants: was "128/…" and "409…" in every figure
    column of an 80-column terminal. Rendering only: the figures are the ones a run of this size has."""
    from rich.console import Console

    from strict_gate.invariance.config import InvariancePolicy
    from strict_gate.invariance.render import print_invariance
    from strict_gate.invariance.verdict import InvarianceResult, VariantResult, VariantVerdict

    variants = tuple(VariantResult(n, a, (), 128, 127, 16384, 16380, 2, 1, (), VariantVerdict.PASS, seconds=10.0,
                                   baseline_seconds=5.0)
                     for n in ("batch-32", "concurrency-8", "chunked_prefill-256") for a in arms)
    console = Console(width=80, record=True)
    print_invariance(InvarianceResult(InvariancePolicy.STRICT, 0.5, {}, variants, {}), console)
    lines = console.export_text().splitlines()
    rows = [ln for ln in lines if " pass " in ln]
    assert len(rows) == len(variants), lines
    for ln in rows:
        assert "127/128" in ln and "16380/16384" in ln and "2 (1 prompts)" in ln and "2.00x" in ln, lines
    assert "…" not in "".join(lines) and max(map(len, lines)) <= 80


# ---------------------------------------------------------------------------- issue 26, items 13-14: not exercised


def _one_prompt_gate(tmp_path: Path, mode: str, invariance: dict) -> Path:
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"id": "q0", "token_ids": [3, 11, 20, 7, 2]}) + "\n", encoding="utf-8")
    arm = {"kind": "command", "command": ["python", ENGINE, "--mode", mode], "timeout_s": 5.0}
    return write_gate(tmp_path, prompts="one.jsonl", max_tokens=4, top_logprobs=2, output_dir="out",
                      reference={"kind": "command", "command": ["python", ENGINE]}, candidate=arm,
                      invariance={"policy": "strict"} | invariance)


def test_batches_of_one_prompt_do_not_read_as_invariant(tmp_path, monkeypatch):
    """One prompt, batch 8, needle, concurrency 4, on an engine whose tokens move only when
    requests share a batch: every variant served the prompt alone. Was: INVARIANT, exit 0."""
    monkeypatch.chdir(tmp_path)
    _one_prompt_gate(tmp_path, "in_flight", {"batch": [8], "needle": True, "concurrency": [4]})
    p = _cli("invariance", "gate.toml")
    assert p.returncode == 3, p.stdout + p.stderr
    v = _variants(tmp_path)
    assert {n: x["verdict"] for n, x in v.items()} == {"batch-8": "incomplete", "concurrency-4": "incomplete",
                                                       "needle": "incomplete"}
    assert all("could not exercise what it names: the prompt set has 1 prompt" in x["problems"][0]
               for x in v.values())
    assert "INVARIANCE INCOMPLETE (batch-8, concurrency-4, needle)" in p.stdout


def test_a_prefill_chunk_longer_than_every_prompt_is_not_a_pass(tmp_path):
    """chunked_prefill 256 over 5-token prompts never splits a prefill. Was: a pass, no note."""
    p = _cli("invariance", str(_gate(tmp_path, "chunk", {"chunked_prefill": [2, 256]})))
    assert p.returncode == 3, p.stdout + p.stderr  # chunk 2 moved, but a variant not exercised is incomplete
    assert "NOT INVARIANT (chunked_prefill-2); INCOMPLETE too (chunked_prefill-256): exit 3" in p.stdout  # the move first
    v = _variants(tmp_path)
    assert v["chunked_prefill-256"]["verdict"] == "incomplete"
    assert "no prompt is longer than 256 tokens (the longest has 5)" in v["chunked_prefill-256"]["problems"][0]
    assert not list((tmp_path / "out").glob("*/invariance/candidate/chunked_prefill-256"))  # no engine started


def test_a_move_under_a_prefill_chunk_is_not_called_batch_dependence(tmp_path):
    p = _cli("invariance", str(_gate(tmp_path, "chunk", {"chunked_prefill": [2]})))
    assert p.returncode == 5, p.stdout + p.stderr
    (d, *_) = _variants(tmp_path)["chunked_prefill-2"]["divergences"]
    assert d["label"] == "prefill-chunk dependence", d  # was: "batch dependence"


# ---------------------------------------------------------------------------- issue 40, items 2-3


def _relative_gate(tmp_path: Path, mode: str, invariance: dict, *, extra: tuple[str, ...] = ()) -> Path:
    """_gate's six prompts and engines, written with relative paths (run it from tmp_path)."""
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]})
                                              + "\n" for i in range(6)), encoding="utf-8")
    arm = {"kind": "command", "command": ["python", ENGINE, "--mode", mode, *extra], "timeout_s": 5.0}
    return write_gate(tmp_path, prompts="p.jsonl", max_tokens=4, top_logprobs=2, output_dir="out", policy="strict",
                      reference={"kind": "command", "command": ["python", ENGINE]}, candidate=arm,
                      invariance={"policy": "strict"} | invariance)


def test_a_gate_interrupted_in_the_candidates_batch_1_run_resumes_its_invariance_on_every_prompt(tmp_path,
                                                                                               monkeypatch):
    """SIGINT to a real gate while the candidate's batch-1 run of [invariance] runs, then `gate
    --resume`: the variant runs on the six prompts and moves, exit 5 as uninterrupted. Was: both
    arms had finished, so the resume tokenized nothing and ran the variants on zero prompts ("the
    prompt set has 0 prompts, so every request was served alone"), INCOMPLETE, exit 3."""
    monkeypatch.chdir(tmp_path)
    _relative_gate(tmp_path, "in_flight", {"batch": [4]}, extra=("--delay", "0.3"))
    gate = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", "gate.toml"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=os.environ | {"COLUMNS": "200"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and gate.poll() is None:
        found = list(Path("out").glob("*/invariance/candidate/baseline/records.jsonl.partial"))
        if found and found[0].read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    gate.send_signal(signal.SIGINT)
    said = gate.communicate(timeout=60)[0]
    assert gate.returncode == 3 and "continue with: strict-gate gate --resume" in said.replace("\n", ""), said
    (d,) = [x for x in Path("out").iterdir() if x.is_dir()]
    assert not (d / "report.json").exists()
    p = _cli("gate", "--resume", str(d))
    assert p.returncode == 5, p.stdout + p.stderr  # was: 3
    assert "0 prompts" not in p.stdout + p.stderr
    doc = json.loads((d / "report.json").read_text())
    (v,) = section(doc, "invariance")["variants"]
    assert (v["name"], v["verdict"], v["prompts_total"], v["prompts_exact"]) == ("batch-4", "fail", 6, 0), v
    baseline = json.loads((d / "invariance" / "candidate" / "baseline" / "manifest.json").read_text())
    assert baseline["status"] == "complete" and len((d / "invariance" / "candidate" / "baseline" / "records.jsonl")
                                                    .read_text().splitlines()) == 6
    assert "NOT INVARIANT (batch-4)" in p.stdout


def test_a_variant_that_moved_leads_the_headline_over_one_the_engine_cannot_run(tmp_path, monkeypatch):
    """batch-4 moves (exit 5 alone) and the binary cannot serve chunked_prefill-2 (no
    "prefill_chunk" in its hello): both are reported, the move first, in the console, report.md
    and report.json; exit 3, README's precedence (a variant not run is never a pass). Was:
    "INCOMPLETE  INVARIANCE INCOMPLETE (batch-4, chunked_prefill-2)", the move filed as incomplete."""
    monkeypatch.chdir(tmp_path)
    _relative_gate(tmp_path, "in_flight", {"chunked_prefill": [2], "batch": [4]}, extra=("--no-chunk",))
    p = _cli("gate", "gate.toml")
    assert p.returncode == 3, p.stdout + p.stderr
    (d,) = [x for x in Path("out").iterdir() if x.is_dir()]
    doc = json.loads((d / "report.json").read_text())
    assert {v["name"]: v["verdict"] for v in section(doc, "invariance")["variants"]} == {
        "batch-4": "fail", "chunked_prefill-2": "incomplete"}
    assert section(doc, "invariance")["verdict"] == "incomplete" and section(doc, "invariance")["exit_code"] == 3
    line = "NOT INVARIANT (batch-4); INCOMPLETE too (chunked_prefill-2): exit 3, policy strict"
    head = [ln for ln in p.stdout.splitlines() if "INVARIAN" in ln]
    assert head and head[0].startswith("FAIL") and line in head[0], p.stdout
    after = p.stdout.split(line, 1)[1]
    assert after.index("batch-4: q0: batch dependence") < after.index("chunked_prefill-2:"), p.stdout  # the move first
    assert f"{line}; see Invariance below." in (d / "report.md").read_text().replace("\\_", "_")
