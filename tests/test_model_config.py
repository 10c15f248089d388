"""`strict-gate model convert` writes a config.json other engines' loaders read (docs/models.md,
"The converted folder in other engines"): every key they need, each with the value the GGUF's own
metadata gives, read here with gguf's reader directly, not through the code under test.

The weights are not converted again (37 s and 538 MB): convert() runs for real with the real
GGUF, its transformers step standing in by the config.json transformers wrote for the cached
conversion, so the completion, the manifest and the rename are the product's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import smollm2_converted

from strict_gate.core import registry_models as rm
from strict_gate.fetch import convert as conv

NAME = "pypi:smollm2-135m"


def _gguf() -> Path:
    smollm2_converted("config.json")  # skips here, fails under CI, as every SmolLM2 test does
    return conv.shipped_file(NAME)


def _metadata(gguf: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    return {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}


@pytest.fixture
def converted(tmp_path, monkeypatch):
    """convert() into a fresh cache, its transformers step replaced by the files it wrote before."""
    cached = smollm2_converted("config.json")
    gguf = _gguf()

    def dequantise(source: Path, out: Path, dtype: str) -> dict[str, str]:
        assert source == gguf and dtype == "float32"
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(cached / name, out / name)
        (out / "model.safetensors").write_bytes(b"stand-in weights")
        return {"transformers": "as cached"}

    monkeypatch.setenv("STRICT_GATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(conv, "_dequantise", dequantise)
    rm._check.cache_clear()
    done = conv.convert(NAME)
    assert done.fresh and done.path == tmp_path / "cache" / "models" / "smollm2-135m"
    return done.path, _metadata(gguf)


def test_the_converted_config_carries_the_ggufs_own_values(converted):
    folder, meta = converted
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_theta"] == meta["llama.rope.freq_base"] == 100000.0
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"]
    assert config["rope_scaling"] is None and "llama.rope.scaling.type" not in meta
    assert config["max_position_embeddings"] == meta["llama.context_length"]
    assert config["rms_norm_eps"] == meta["llama.attention.layer_norm_rms_epsilon"]
    assert config["head_dim"] == meta["llama.rope.dimension_count"]
    assert config["num_key_value_heads"] == meta["llama.attention.head_count_kv"]
    assert config["bos_token_id"] == meta["tokenizer.ggml.bos_token_id"]
    assert config["eos_token_id"] == meta["tokenizer.ggml.eos_token_id"]
    assert config["tie_word_embeddings"] is True  # the GGUF has no output.weight: the embedding is reused
    assert config["torch_dtype"] == config["dtype"] == "float32"


def test_the_completed_folder_is_verified_and_loads_in_transformers(converted):
    from transformers import AutoConfig

    folder, meta = converted
    assert rm.resolve_registry_model(NAME) == str(folder)  # the manifest hashed the completed file
    loaded = AutoConfig.from_pretrained(str(folder))
    assert loaded.rope_parameters["rope_theta"] == meta["llama.rope.freq_base"]
    assert loaded.max_position_embeddings == meta["llama.context_length"]
    assert loaded.tie_word_embeddings is True and loaded.head_dim == 64
