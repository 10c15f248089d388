"""A config.json the conversion completes from the GGUF is never written when the two disagree,
nor when a key other loaders need comes from neither (exit 2, naming the file); a bool is never
taken for the integer 1. No weights needed: the facts are handed in as the GGUF reader gives them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.core import registry_models as rm
from strict_gate.errors import ConfigError
from strict_gate.fetch import convert as conv
from strict_gate.fetch import hf_config

FACTS = {"rope_theta": 100000.0, "max_position_embeddings": 8192, "rms_norm_eps": 9.999999747378752e-06,
         "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "vocab_size": 49152, "head_dim": 64, "bos_token_id": 1, "eos_token_id": 2,
         "rope_scaling": None, "tie_word_embeddings": True}
WRITTEN = {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
           "dtype": "float32", "hidden_size": 576, "tie_word_embeddings": True}


def test_agreeing_facts_complete_the_config():
    done = hf_config.completed(WRITTEN, FACTS, "float32")
    assert all(key in done for key in hf_config.REQUIRED)
    assert done["rope_theta"] == 100000.0 and done["torch_dtype"] == "float32"


@pytest.mark.parametrize(("written", "said"), [
    ({"rope_parameters": {"rope_theta": 10000.0}}, "rope_theta"),
    ({"max_position_embeddings": 2048}, "max_position_embeddings"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"eos_token_id": 0}, "eos_token_id"),
    ({"torch_dtype": "bfloat16"}, "torch_dtype"),
])
def test_a_config_that_disagrees_with_its_gguf_is_refused(written, said):
    with pytest.raises(ConfigError, match=said):
        hf_config.completed({**WRITTEN, **written}, FACTS, "float32", where="x/config.json")


def test_a_bool_is_not_the_integer_one():
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        hf_config.completed({**WRITTEN, "tie_word_embeddings": 1}, FACTS, "float32")


def test_a_key_neither_side_gives_is_refused(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setattr(hf_config, "gguf_facts", lambda gguf: {"rope_theta": 1e4})
    with pytest.raises(ConfigError, match="max_position_embeddings") as e:
        hf_config.complete_config_file(tmp_path, tmp_path / "m.gguf", "float32")
    assert e.value.path == str(tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": "llama"}  # untouched


def test_model_convert_exits_2_and_leaves_no_model_when_they_disagree(tmp_path, monkeypatch):
    monkeypatch.setenv("STRICT_GATE_CACHE", str(tmp_path / "cache"))
    rm._check.cache_clear()
    monkeypatch.setattr(conv, "_checked_source", lambda model: tmp_path / "m.gguf")

    def dequantise(source, out, dtype):
        (out / "config.json").write_text(json.dumps({**WRITTEN, "rope_parameters": {"rope_theta": 10000.0}}))
        (out / "model.safetensors").write_bytes(b"w")
        return {}

    monkeypatch.setattr(conv, "_dequantise", dequantise)
    monkeypatch.setattr(hf_config, "gguf_facts", lambda gguf: FACTS)
    r = CliRunner().invoke(app, ["model", "convert", "pypi:smollm2-135m"], terminal_width=300)
    assert r.exit_code == 2, r.output
    assert "rope_theta" in r.output and "config.json" in r.output and "Traceback" not in r.output
    models = tmp_path / "cache" / "models"
    assert not (models / "smollm2-135m").exists() and list(models.iterdir()) == []
