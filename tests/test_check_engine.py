"""`strict-gate check-engine` on engines that do what docs/engine-protocol.md asks.

Real engines only: a conformant toy (tests/engines/conformant_engine.py), the shipped adapters
(the minimal engine, the KDA example, CTranslate2 and llama.cpp where their venvs and models are
installed: skipped otherwise, failed under CI as their own tests do) and transformers in process.
The engines that break one check each are in tests/test_adversarial_check_engine.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need

from strict_gate.check_engine import CHECKS, Checklist, check_engine, load_engine_arm
from strict_gate.check_engine.numerics import Tolerance, dtype_bits
from strict_gate.check_engine.probe import PROMPT_COUNT, prompt_inputs
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.errors import ConfigError
from strict_gate.gate.config import ArmConfig
from strict_gate.runs.prompts import load_prompts

ROOT = Path(__file__).resolve().parent.parent
CONFORMANT = ROOT / "tests" / "engines" / "conformant_engine.py"
MINIMAL = ROOT / "examples" / "engines" / "minimal_engine.py"
NAMES = [s.name for s in CHECKS]
PROTOCOL_ONLY = {s.name for s in CHECKS if s.protocol_only}
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def command_arm(argv: list[str], **options) -> ArmConfig:
    return ArmConfig("engine", "command", CommandOptions(command=argv, timeout_s=10, **options), base_dir=ROOT)


def statuses(checklist: Checklist) -> dict[str, str]:
    return {c.name: c.status.value for c in checklist.checks}


def expect(**changed: str) -> dict[str, str]:
    """Every check passes but those named."""
    return {name: changed.get(name, "pass") for name in NAMES}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", "check-engine", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def write_engine_toml(path: Path, script: Path) -> Path:
    path.write_text(f'kind = "command"\ncommand = ["python", "{script}"]\ntimeout_s = 10\n', encoding="utf-8")
    return path


def test_a_conformant_engine_passes_every_check(tmp_path):
    checklist = check_engine(command_arm(["python", str(CONFORMANT)]), log_dir=tmp_path)
    assert statuses(checklist) == expect(), checklist.lines()
    assert checklist.exit_code == 0
    assert checklist.tolerance.startswith("1e-06 nats for float64 (the hello)")
    assert "bundled tokenizer" in checklist.prompts  # the engine has no tokenizer of its own
    assert checklist.log == str(tmp_path / "engine.log") and (tmp_path / "engine.log").is_file()


def test_the_minimal_engine_passes_what_it_implements(tmp_path):
    """No score, no token events, no ignore_eos, nothing in flight, no prefill_chunk, no dump:
    those are not applicable, never a pass."""
    checklist = check_engine(command_arm(["python", str(MINIMAL)]), log_dir=tmp_path)
    assert statuses(checklist) == expect(ignore_eos="not_applicable", prefill_decode="not_applicable",
                                         stream="not_applicable", in_flight="not_applicable",
                                         prefill_chunk="not_applicable", dump="not_applicable",
                                         graft="not_applicable", dump_decode="not_applicable",
                                         graft_ops="not_applicable"), checklist.lines()
    by_name = {c.name: c for c in checklist.checks}
    assert "does not implement ignore_eos" in by_name["ignore_eos"].detail
    assert "not declared, and a score request gets an error reply" in by_name["score"].detail
    assert checklist.exit_code == 0


def test_the_cli_prints_the_checklist_and_json(tmp_path):
    toml = write_engine_toml(tmp_path / "engine.toml", CONFORMANT)
    text = cli(str(toml))
    assert text.returncode == 0, text.stderr
    assert "21 checks: 21 pass, 0 fail, 0 n/a, 0 skipped -> exit 0" in text.stdout
    out = cli(str(toml), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["schema"] == "strict-gate/check-engine@1" and report["exit_code"] == 0
    assert [c["name"] for c in report["checks"]] == NAMES
    assert all(set(c) == {"name", "status", "section", "detail", "finding"} for c in report["checks"])
    assert report["counts"] == {"pass": 21, "fail": 0, "not_applicable": 0, "skipped": 0}
    assert report["engine"]["versions"]["conformant"] == "1.0"


def test_bad_input_is_exit_2_naming_the_file_and_line(tmp_path):
    toml = tmp_path / "engine.toml"
    toml.write_text(f'kind = "command"\ncommand = ["python", "{CONFORMANT}"]\ntimeout = 10\n', encoding="utf-8")
    r = cli(str(toml))
    assert r.returncode == 2 and f"{toml}:3:" in r.stderr and "timeout_s" in r.stderr  # did you mean
    assert "Traceback" not in r.stderr
    missing = cli(str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_a_stored_run_is_not_an_engine(tmp_path):
    toml = tmp_path / "recorded.toml"
    toml.write_text(f'kind = "recorded"\npath = "{ROOT / "baselines" / "tiny-llama-vllm-fp32"}"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="stored run"):
        load_engine_arm(toml)
    assert cli(str(toml)).returncode == 2


def test_a_gate_config_gives_its_candidate_unless_told_another_arm():
    gate = ROOT / "gates" / "kda-chunk.toml"
    assert load_engine_arm(gate).kind == "command"
    assert load_engine_arm(gate, "reference").kind == "hf"
    with pytest.raises(ConfigError, match="no \\[rescorer\\]"):
        load_engine_arm(gate, "rescorer")
    with pytest.raises(ConfigError, match="--arm must be one of"):
        load_engine_arm(gate, "candidat")


def test_prompts_option_takes_the_first_prompts_with_their_own_ids(tmp_path):
    lines = [json.dumps({"id": f"t{i}", "token_ids": [1, 100 + i, 7]}) for i in range(6)]
    (tmp_path / "ids.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ps = load_prompts(tmp_path / "ids.jsonl")
    engine = CommandEngine(CommandOptions(command=["python", str(CONFORMANT)]))
    inputs, where = prompt_inputs(engine, ps)  # no tokenizer needed: nothing is started
    assert [p.id for p in inputs] == [f"t{i}" for i in range(PROMPT_COUNT)]
    assert inputs[2].token_ids == (1, 102, 7) and where == f"{PROMPT_COUNT} prompts of ids"


@pytest.mark.parametrize(("dtype", "nats"), [("float64", 1e-6), ("float32", 1e-3), ("bfloat16", 0.25),
                                             ("int8", 0.25), ("q8_0", 0.25), ("q4_k_m", 0.5), ("int4", 0.5),
                                             (None, 0.5), ("float33", 0.5)])
def test_tolerance_follows_the_dtype_and_an_unknown_one_gets_the_loosest(dtype, nats):
    tol = Tolerance.for_dtype(dtype, "the hello")
    assert tol.nats == nats
    if dtype is None or dtype_bits(dtype) is None:
        assert "loosest" in tol.describe()


@pytest.mark.slow
def test_transformers_runs_the_generate_checks_and_not_the_protocol_ones(tmp_path):
    need("transformers")
    checklist = check_engine(load_engine_arm(ROOT / "gates" / "hf-vs-vllm-fp32.toml"), log_dir=tmp_path)
    got = statuses(checklist)
    assert {n for n, s in got.items() if s == "not_applicable"} - {"ties"} == PROTOCOL_ONLY, checklist.lines()
    assert all(got[n] == "pass" for n in NAMES if n not in PROTOCOL_ONLY | {"ties"}), checklist.lines()
    assert got["ties"] in ("pass", "not_applicable") and checklist.exit_code == 0
    assert checklist.tolerance.startswith("0.001 nats for float32 (the hf options)")


@pytest.mark.slow
def test_the_kda_adapter_passes(tmp_path):
    """examples/engines/kda_engine.py stops on the request's eos_token_ids and honours ignore_eos
    (it once stopped on its model's own EOS set: check-engine's eos check caught it)."""
    need("transformers")
    checklist = check_engine(load_engine_arm(ROOT / "gates" / "kda-chunk.toml"), log_dir=tmp_path)
    assert statuses(checklist) == expect(stream="not_applicable"), checklist.lines()


def _installed(*paths: Path, install: str) -> None:
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    if missing:
        why = f"not installed ({', '.join(missing)} missing); run: {install}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the engine is {why}", pytrace=False)
        pytest.skip(why)


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["ctranslate2-float32.toml", "ctranslate2-int8.toml"])
def test_the_ctranslate2_adapter_passes(tmp_path, gate):
    _installed(ROOT / ".venvs" / "ctranslate2" / "bin" / "python", ROOT / "build" / "ct2" / "tiny-llama-int8",
               install="bash scripts/install-ctranslate2.sh")
    checklist = check_engine(load_engine_arm(ROOT / "gates" / gate), log_dir=tmp_path)
    # it declares generate and score only: the capability checks (in_flight, prefill_chunk, dump,
    # graft, dump_decode) do not apply
    assert statuses(checklist) == expect(ignore_eos="not_applicable", ties=statuses(checklist)["ties"],
                                         stream="not_applicable", in_flight="not_applicable",
                                         prefill_chunk="not_applicable", dump="not_applicable",
                                         graft="not_applicable", dump_decode="not_applicable",
                                         graft_ops="not_applicable"), checklist.lines()
    assert statuses(checklist)["ties"] in ("pass", "not_applicable")


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["llamacpp-f32.toml", "llamacpp-q8_0.toml"])
def test_the_llamacpp_adapter_passes(tmp_path, gate):
    _installed(ROOT / ".venvs" / "llamacpp" / "bin" / "python", ROOT / "build" / "gguf" / "tiny-llama-q8_0.gguf",
               install="bash scripts/install-llamacpp.sh")
    checklist = check_engine(load_engine_arm(ROOT / "gates" / gate), log_dir=tmp_path)
    # it declares dump (and dump_decode), not graft, requests in flight or prefill chunks
    assert statuses(checklist) == expect(ties=statuses(checklist)["ties"], stream="not_applicable",
                                         in_flight="not_applicable", prefill_chunk="not_applicable",
                                         graft="not_applicable", graft_ops="not_applicable"), checklist.lines()
    assert statuses(checklist)["ties"] in ("pass", "not_applicable")


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["openvino-f32.toml", "openvino-int8.toml"])
def test_the_openvino_adapter_passes(tmp_path, gate):
    _installed(ROOT / ".venvs" / "openvino" / "bin" / "python", ROOT / "build" / "openvino" / "tiny-llama-int8",
               install="bash scripts/install-openvino.sh")
    checklist = check_engine(load_engine_arm(ROOT / "gates" / gate), log_dir=tmp_path)
    # generate (GenAI's greedy loop, ignore_eos included) and score (plain OpenVINO) only
    assert statuses(checklist) == expect(ties=statuses(checklist)["ties"], stream="not_applicable",
                                         in_flight="not_applicable", prefill_chunk="not_applicable",
                                         dump="not_applicable", graft="not_applicable",
                                         dump_decode="not_applicable", graft_ops="not_applicable"), checklist.lines()
    assert statuses(checklist)["ties"] in ("pass", "not_applicable")


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["mistralrs-f32.toml", "mistralrs-q8_0.toml"])
def test_the_mistralrs_adapter_passes(tmp_path, gate):
    _installed(ROOT / ".venvs" / "mistralrs" / "bin" / "python", ROOT / "build" / "mistralrs" / "tiny-llama",
               install="bash scripts/install-mistralrs.sh")
    checklist = check_engine(load_engine_arm(ROOT / "gates" / gate), log_dir=tmp_path)
    # generate only: mistral.rs has no teacher-forced scoring, so prefill_decode has nothing to compare
    assert statuses(checklist) == expect(ties=statuses(checklist)["ties"], prefill_decode="not_applicable",
                                         stream="not_applicable", in_flight="not_applicable",
                                         prefill_chunk="not_applicable", dump="not_applicable",
                                         graft="not_applicable", dump_decode="not_applicable",
                                         graft_ops="not_applicable"), checklist.lines()
    assert statuses(checklist)["ties"] in ("pass", "not_applicable")
