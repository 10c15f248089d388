"""Lossless speculative decoding: the [invariance] speculative variant on the C++ example engine,
which drafts by prompt lookup and verifies in one forward (examples/engines/cpp/speculative.hpp).

The shipped gate runs as a user types it, from gates/ with its relative paths. The three
classic bugs are planted in the real binary behind STRICT_GATE_CPP_SPEC_BUG (an env switch the
example engine reads for these tests only): each leaves the plain gate passing (its token
verdict) and is caught by the speculative variant, which names the prompt and the position.
Config mistakes are exit 2 with file and line; the counts' rules and the /metrics reader are
checked on their own. Nothing is mocked. vLLM's offline and server paths: test_speculative_vllm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import section

from strict_gate.engines.speculative import Acceptance, prometheus_counters, reply_acceptance
from strict_gate.gate.config import load_gate_config

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")
SHIPPED = ROOT / "gates" / "cpp-f32-speculative.toml"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=900)


def _planted(tmp_path: Path, bug: str, *, invariance: bool = True) -> Path:
    """The shipped gate in tmp_path, the binary started with the bug planted, one K = 3 variant."""
    text = SHIPPED.read_text(encoding="utf-8").replace('"../', f'"{ROOT}/')
    head, _, _ = text.partition("\n[invariance]\n")
    cand = head.replace('startup_timeout_s = 60\n', f'startup_timeout_s = 60\nenv = {{ STRICT_GATE_CPP_SPEC_BUG = "{bug}" }}\n')
    assert cand != head
    tail = '\n\n[invariance]\narms = ["candidate"]\nspeculative = [{ method = "ngram", num_speculative_tokens = 3 }]\n' \
           'policy = "strict"\n'
    path = tmp_path / "planted.toml"
    path.write_text(cand + (tail if invariance else ""), encoding="utf-8")
    return path


def _report(where: Path) -> dict:
    (path,) = where.glob("reports/*/report.json")
    return json.loads(path.read_text())


def test_the_shipped_gate_speculating_equals_itself_not_speculating(binary, tmp_path):
    """As the gate's comment says, from the repository root with its relative path; every
    variant 128/128 exact, with the engine's counts and the time with and without."""
    r = _cli("invariance", "gates/cpp-f32-speculative.toml", "-o", str(tmp_path), cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out = r.stdout
    (path,) = tmp_path.glob("cpp-f32-speculative-invariance-*/invariance.json")
    variants = {v["name"]: v for v in json.loads(path.read_text())["invariance"]["variants"]}
    assert set(variants) == {"speculative-ngram-3", "speculative-ngram-5-max4-min2"}
    for v in variants.values():
        assert v["verdict"] == "pass" and v["prompts_exact"] == 128 and v["exact"], v
        a = v["acceptance"]
        assert a["replies"] == 128 and a["drafted"] > 0 and 0 <= a["accepted"] <= a["drafted"]
        assert a["drafts"] > 0 and a["mean_accepted_length"] >= 1.0
        assert v["seconds"] > 0 and v["baseline_seconds"] > 0
    assert "tokens equal, 128/128 exact; drafted" in out


@pytest.mark.parametrize("bug", ["accept-mismatch", "off-by-one", "no-rollback"])
def test_each_planted_speculation_bug_passes_the_plain_gate_and_is_caught_by_the_variant(binary, tmp_path,
                                                                                          monkeypatch, bug):
    monkeypatch.chdir(tmp_path)
    plain = _cli("gate", str(_planted(tmp_path, bug, invariance=False).name), cwd=tmp_path)
    assert plain.returncode == 0, (plain.stdout + plain.stderr)[-3000:]  # blind without the variant
    shutil.rmtree(tmp_path / "reports")
    r = _cli("gate", _planted(tmp_path, bug).name, cwd=tmp_path)
    assert r.returncode == 5, (r.stdout + r.stderr)[-3000:]
    report = _report(tmp_path)
    assert report["verdict"] == "pass"  # the token verdict: the plain run is untouched by the bug
    (v,) = section(report, "invariance")["variants"]
    assert v["verdict"] == "fail" and v["divergences"], v
    first = v["divergences"][0]
    assert first["position"] is not None and first["position"] >= 1  # the first token comes from the prefill
    assert first["label"].startswith("speculation"), first
    assert f"speculative-ngram-3: {first['id']}: {first['label']} at position {first['position']}" in r.stdout
    assert "NOT INVARIANT (speculative-ngram-3), policy strict" in r.stdout


@pytest.mark.parametrize(("entry", "why"), [
    ('{ method = "ngram" }', "num_speculative_tokens must be an integer >= 1"),
    ('{ method = "ngram", num_speculative_tokens = 0 }', "num_speculative_tokens must be an integer >= 1"),
    ('{ method = "ngram", num_speculative_tokens = 3, lookahead = 2 }', "unknown key 'lookahead'"),
    ('{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_min = 4, prompt_lookup_max = 2 }',
     "prompt_lookup_min 4 is above prompt_lookup_max 2"),
    ('{ method = "Ngram!", num_speculative_tokens = 3 }', "method must be a method name"),
    ('{ method = "ngram", num_speculative_tokens = 3 }, { method = "ngram", num_speculative_tokens = 3 }',
     "lists speculative-ngram-3 twice"),
])
def test_a_bad_speculative_entry_is_exit_2_with_file_and_line(tmp_path, monkeypatch, entry, why):
    monkeypatch.chdir(tmp_path)
    text = SHIPPED.read_text(encoding="utf-8").replace('"../', f'"{ROOT}/')
    head, _, _ = text.partition("\n[invariance]\n")
    (tmp_path / "g.toml").write_text(head + f"\n[invariance]\nspeculative = [{entry}]\npolicy = \"strict\"\n",
                                     encoding="utf-8")
    line = head.count("\n") + 3
    r = _cli("invariance", "g.toml", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert why in r.stderr and f"g.toml:{line}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_an_arm_that_cannot_speculate_is_refused_when_the_config_is_read(tmp_path):
    text = SHIPPED.read_text(encoding="utf-8").replace('"../', f'"{ROOT}/')
    (tmp_path / "g.toml").write_text(text.replace('arms = ["candidate"]', 'arms = ["reference"]'), encoding="utf-8")
    with pytest.raises(Exception, match="stored run"):
        load_gate_config(tmp_path / "g.toml")


def test_the_counts_a_reply_can_prove():
    assert reply_acceptance({}, 16, 3) == Acceptance(replies_without=1)
    got = reply_acceptance({"speculative": {"drafted": 9, "accepted": 4, "drafts": 3}}, 16, 3)
    assert (got.drafted, got.accepted, got.drafts, got.replies, got.replies_drafting) == (9, 4, 3, 1, 1)
    for bad, rule in [({"drafted": 2, "accepted": 3}, "accepted <= drafted"),
                      ({"drafted": 40, "accepted": 16}, "at most emitted - 1"),
                      ({"drafted": 46, "accepted": 1}, "at most K drafts"),
                      ({"drafted": 3, "accepted": 1, "drafts": 0}, "drafts > 0 exactly when"),
                      ({"drafted": -1, "accepted": 0}, "integer >= 0"),
                      ({"drafted": True, "accepted": 0}, "integer >= 0"),
                      ([1, 2], "must be an object")]:
        with pytest.raises(ValueError, match=rule):
            reply_acceptance({"speculative": bad}, 16, 3)
    total = got + reply_acceptance({}, 4, 3)
    assert (total.replies, total.replies_without, total.rate) == (1, 1, 4 / 9)
    assert total.mean_accepted_length == 1 + 4 / 3 and total.since(got).replies_without == 1


def test_vllms_counters_from_a_metrics_page():
    """The page format vLLM's server writes (prometheus_client text), two engines' label sets summed."""
    page = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} 1.7e9',
        'vllm:num_requests_running{engine="0"} 1.0',
    ])
    assert prometheus_counters(page) == {"drafts": 10.0, "drafted": 30.0, "accepted": 12.0}
    assert prometheus_counters("vllm:num_requests_running 1\n") == {}
