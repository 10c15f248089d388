"""config.json completed from the GGUF's own metadata, so loaders other than this transformers read it.

transformers 5 writes a config in its own newest form: the rotary base only inside
`rope_parameters`, the dtype only as `dtype`. Other loaders of a Hugging Face folder read the
older flat keys (mistral.rs refuses a llama config without `rope_theta`; older transformers,
and the converters built on them, read `torch_dtype` and `rope_scaling`). So after
`save_pretrained` the conversion adds every key such a loader needs, each from the GGUF's
metadata (the file the weights came from), and refuses when a key transformers wrote says
otherwise than the GGUF: a config that disagrees with its own weights' file is never written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from strict_gate.errors import ConfigError

# config.json key -> the GGUF metadata key it comes from ({arch}: general.architecture).
FROM_GGUF: tuple[tuple[str, str], ...] = (
    ("rope_theta", "{arch}.rope.freq_base"),
    ("max_position_embeddings", "{arch}.context_length"),
    ("rms_norm_eps", "{arch}.attention.layer_norm_rms_epsilon"),
    ("hidden_size", "{arch}.embedding_length"),
    ("intermediate_size", "{arch}.feed_forward_length"),
    ("num_hidden_layers", "{arch}.block_count"),
    ("num_attention_heads", "{arch}.attention.head_count"),
    ("num_key_value_heads", "{arch}.attention.head_count_kv"),
    ("vocab_size", "{arch}.vocab_size"),
    ("head_dim", "{arch}.attention.key_length"),
    ("bos_token_id", "tokenizer.ggml.bos_token_id"),
    ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ("unk_token_id", "tokenizer.ggml.unknown_token_id"),
)
# The keys a loader of the folder other than transformers 5 needs (docs/models.md).
REQUIRED: tuple[str, ...] = (
    "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps", "head_dim",
    "tie_word_embeddings", "torch_dtype", "dtype", "bos_token_id", "eos_token_id",
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size",
)


def gguf_facts(gguf: Path) -> dict[str, Any]:
    """What the GGUF's metadata says of each config key (only the keys it carries), and whether
    the output projection is tied (no `output.weight` tensor: the embedding is reused)."""
    try:
        from gguf import GGUFReader
    except ImportError as e:  # pragma: no cover - convert imports it first
        from strict_gate.errors import MissingExtraError

        raise MissingExtraError(e.name or "gguf", "gguf") from e
    reader = GGUFReader(str(gguf))
    fields = {name: field.contents() for name, field in reader.fields.items()
              if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}
    arch = str(fields.get("general.architecture", "llama"))
    facts = {key: fields[src.format(arch=arch)] for key, src in FROM_GGUF if src.format(arch=arch) in fields}
    if "head_dim" not in facts and f"{arch}.rope.dimension_count" in fields:
        facts["head_dim"] = fields[f"{arch}.rope.dimension_count"]
    facts["rope_scaling"] = _rope_scaling(fields, arch)
    facts["tie_word_embeddings"] = not any(t.name == "output.weight" for t in reader.tensors)
    return facts


def _rope_scaling(fields: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = fields.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": str(kind), "type": str(kind)}
    if f"{arch}.rope.scaling.factor" in fields:
        scaling["factor"] = float(fields[f"{arch}.rope.scaling.factor"])
    if f"{arch}.rope.scaling.original_context_length" in fields:
        scaling["original_max_position_embeddings"] = int(fields[f"{arch}.rope.scaling.original_context_length"])
    return scaling


def completed(config: dict[str, Any], facts: dict[str, Any], dtype: str, *, where: str = "config.json") -> dict[str, Any]:
    """config.json with every fact added; a fact transformers wrote otherwise is refused (exit 2)."""
    out = dict(config)
    for key, value in facts.items():
        written = _written(config, key)
        if written is not None and not _same(written, value):
            raise ConfigError(f"transformers wrote {key} = {written!r} but the GGUF's metadata says "
                              f"{value!r}; the conversion is refused, nothing was written", path=where)
        out[key] = value if written is None else written
    for key in ("torch_dtype", "dtype"):
        if out.get(key, dtype) != dtype:
            raise ConfigError(f"{key} = {out[key]!r}, but the weights were written as {dtype}", path=where)
        out[key] = dtype
    return out


def _written(config: dict[str, Any], key: str) -> Any:
    if key == "rope_theta" and key not in config:
        return (config.get("rope_parameters") or {}).get("rope_theta")
    return config.get(key)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def complete_config_file(folder: Path, gguf: Path, dtype: str) -> None:
    """Rewrite folder/config.json completed from the GGUF (before the manifest: it is hashed after)."""
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    done = completed(config, gguf_facts(gguf), dtype, where=str(path))
    missing = [key for key in REQUIRED if key not in done]
    if missing:
        raise ConfigError(f"neither transformers nor the GGUF's metadata gives {', '.join(missing)}; "
                          "other engines could not load this folder", path=str(path))
    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(done, indent=2, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
