"""`strict-gate check-engine` against engines broken on purpose, one check each, and hostile ones.

Each tests/engines/check_*.py is the conformant toy (tests/engines/conformant_engine.py, which
passes every check) with one thing broken: it must fail that check and only that one, so the
whole checklist is asserted, and the failure must say what was seen. Real processes over the
real protocol throughout; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strict_gate.check_engine import CHECKS, Checklist, check_engine
from strict_gate.engines.command.engine import CommandOptions
from strict_gate.gate.config import ArmConfig

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ROOT / "tests" / "engines"
NAMES = [s.name for s in CHECKS]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

# engine -> (the checks that do not pass, and how; a phrase the failure's detail must hold)
BROKEN = {
    "check_hello": ({"hello": "fail"}, "'eager' is 'yes', not a bool"),
    "check_not_greedy": ({"greedy": "fail"}, "step 2: chose"),
    "check_nondeterministic": ({"determinism": "fail"}, "the same request twice in a row"),
    "check_max_tokens": ({"max_tokens": "fail"}, "tokens for max_tokens = 1"),
    "check_eos": ({"eos": "fail"}, "every id of the list ends the sequence"),
    "check_ignore_eos": ({"ignore_eos": "fail"}, "rule finish-reason"),
    "check_top_logprobs": ({"top_logprobs": "fail"}, "asked for the top 5, it lists 4"),
    "check_ties": ({"ties": "fail"}, "has the same logprob"),
    "check_score_crash": ({"score": "fail", "prefill_decode": "skipped"}, "exited with code 134"),
    "check_score_undeclared": ({"score": "fail", "prefill_decode": "not_applicable"}, "does not declare it"),
    "check_prefill": ({"prefill_decode": "fail"}, "max |Δ logprob| 0.05 nats"),
    "check_score_next_top": ({"prefill_decode": "fail"}, "the prefill's argmax is another token"),
    "check_in_flight": ({"in_flight": "fail"}, "the tokens depend on how they are served"),
    "check_prefill_chunk": ({"prefill_chunk": "fail"}, "with prefill_chunk"),
    "check_dump": ({"dump": "fail"}, "the dump is not of this computation"),
    "check_graft": ({"graft": "fail"}, "the graft is ignored"),
    "check_dump_decode": ({"dump_decode": "fail"}, "the decode-path dump is not of this computation"),
    "check_graft_ops": ({"graft_ops": "fail"}, "the op graft is ignored"),
    "check_stream": ({"stream": "fail"}, "must be the response's token_ids"),
    "check_unknown_op": ({"unknown_op": "fail"}, "exited with code 1"),
    "check_any_op_generates": ({"unknown_op": "fail"}, "not {\"id\": 'check-unknown-op', \"error\""),
    "check_malformed": ({"malformed": "fail"}, "exited with code 1"),
    "check_timing": ({"timing": "fail"}, "seconds, not milliseconds"),
    "check_eof": ({"eof": "fail"}, "exited with code 1 when its stdin closed"),
}


def arm(script: str, timeout_s: float = 10, **env: str) -> ArmConfig:
    options = CommandOptions(command=[sys.executable, str(ENGINES / f"{script}.py")], timeout_s=timeout_s,
                             startup_timeout_s=30)
    return ArmConfig("engine", "command", options, env=env, base_dir=ROOT)


def statuses(checklist: Checklist) -> dict[str, str]:
    return {c.name: c.status.value for c in checklist.checks}


def test_every_check_has_a_broken_engine():
    failing = {name for changed, _ in BROKEN.values() for name, status in changed.items() if status == "fail"}
    assert failing == set(NAMES)


@pytest.mark.parametrize("script", sorted(BROKEN))
def test_a_broken_engine_fails_its_check_and_only_that_one(tmp_path, script):
    changed, phrase = BROKEN[script]
    checklist = check_engine(arm(script), log_dir=tmp_path)
    assert statuses(checklist) == {n: changed.get(n, "pass") for n in NAMES}, checklist.lines()
    failed = [c for c in checklist.checks if c.status.value == "fail"]
    assert len(failed) == 1 and phrase in failed[0].detail, failed[0].detail
    assert failed[0].finding == (failed[0].name in ("prefill_decode", "in_flight", "prefill_chunk"))
    assert checklist.exit_code == 1


def test_an_engine_that_never_says_hello_is_exit_3_with_the_rest_skipped(tmp_path):
    never = ArmConfig("engine", "command", CommandOptions(
        command=["python", "-c", "import sys; sys.exit('no weights at /models/x')"], timeout_s=5), base_dir=ROOT)
    checklist = check_engine(never, log_dir=tmp_path)
    assert checklist.exit_code == 3 and not checklist.started
    assert statuses(checklist) == {n: "fail" if n == "hello" else "skipped" for n in NAMES}
    assert "never started" in checklist.checks[0].detail and "no weights at /models/x" in checklist.checks[0].detail


def test_the_cli_says_3_and_still_prints_the_json_of_an_engine_that_never_starts(tmp_path):
    toml = tmp_path / "engine.toml"
    toml.write_text('kind = "command"\ncommand = ["python", "-c", "import sys; sys.exit(7)"]\n', encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "check-engine", str(toml), "--json"], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    report = json.loads(r.stdout)
    assert report["exit_code"] == 3 and report["checks"][0]["status"] == "fail"
    assert "exited with code 7" in report["checks"][0]["detail"]


def test_a_hang_fails_within_timeout_s_and_the_checks_that_need_its_records_are_skipped(tmp_path):
    """Every generate request hangs: the two checks that send one first fail, naming timeout_s."""
    checklist = check_engine(arm("check_hangs", timeout_s=1), log_dir=tmp_path)
    got = statuses(checklist)
    assert {n for n, s in got.items() if s == "pass"} == {"hello", "eof"}, checklist.lines()
    failed = [c for c in checklist.checks if c.status.value == "fail"]
    assert [c.name for c in failed] == ["greedy", "malformed"]
    assert all("no answer within timeout_s = 1 s" in c.detail for c in failed)
    assert got["ties"] == "not_applicable" and checklist.exit_code == 1
    assert all(s == "skipped" for n, s in got.items() if n not in {"hello", "greedy", "malformed", "ties", "eof"})


def test_a_crash_costs_the_check_it_hit_and_a_fresh_engine_serves_the_rest(tmp_path):
    marker = tmp_path / "crashed"
    checklist = check_engine(arm("check_crash_once", CRASH_ONCE_MARKER=str(marker)), log_dir=tmp_path)
    assert marker.exists()
    assert statuses(checklist) == {n: "fail" if n == "determinism" else "pass" for n in NAMES}, checklist.lines()
    assert "SIGSEGV" in checklist.checks[2].detail


def test_a_secret_the_engine_echoes_is_not_in_the_checklist(tmp_path):
    secret = "hf_check_engine_secret_0123456789"
    toml = tmp_path / "engine.toml"
    toml.write_text(f'kind = "command"\ncommand = ["python", "{ENGINES / "check_leaks_secret.py"}"]\n'
                    f'[env]\nHF_TOKEN = "{secret}"\n', encoding="utf-8")
    for extra in ((), ("--json",)):
        r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "check-engine", str(toml), *extra], cwd=ROOT,
                           env=ENV, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert secret not in r.stdout + r.stderr
        assert "my token is" in r.stdout  # the reply was quoted, the secret in it redacted


@pytest.mark.parametrize("script, check", [("check_in_flight", "in_flight"), ("check_dump", "dump"),
                                           ("check_graft", "graft"), ("check_graft_ops", "graft_ops"),
                                           ("check_prefill_chunk", "prefill_chunk"),
                                           ("check_dump_decode", "dump_decode")])
def test_a_declared_capability_is_exercised_from_the_cli(tmp_path, monkeypatch, script, check):
    """Issue 26, item 10: an engine declaring dump, graft, prefill_chunk and max_in_flight 4,
    one of them broken, through `strict-gate check-engine engine.toml` from its directory.
    Was: exit 0, no check sent dump, graft, prefill_chunk or two requests at once."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "engines").symlink_to(ENGINES)
    Path("engine.toml").write_text(f'kind = "command"\ncommand = {json.dumps([sys.executable, f"engines/{script}.py"])}\n',
                                   encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "check-engine", "engine.toml", "--json"], env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = [c["name"] for c in json.loads(r.stdout)["checks"] if c["status"] == "fail"]
    assert failed == [check]


def test_a_prefill_decode_check_that_cannot_tell_the_paths_apart_says_so(tmp_path):
    """Issue 26, item 12: generate logprobs that are a prefill pass agree with score bit for bit
    in bfloat16. Was: a plain pass, "0 nats", with nothing said."""
    checklist = check_engine(arm("check_prefill_as_decode"), log_dir=tmp_path)
    (pd,) = [c for c in checklist.checks if c.name == "prefill_decode"]
    assert pd.status.value == "pass" and "cannot tell the two paths apart" in pd.detail, pd.detail
