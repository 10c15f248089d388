"""`[invariance] state_boundaries`: the chunk its variants cut at, read from the model where it says it.

A linear-attention or hybrid model (KDA, GDN, Mamba) carries a state from one prefill chunk to the
next and checkpoints it every `state_block` tokens for the prefix cache. A state-carry bug lives at
those boundaries (vLLM's Kimi-Linear moved 16 of 48 prompts with its prefill cut every 16 tokens on
an H100), so the key expands into prefill cuts one token before, at and after the chunk and at two
points inside it, and prefix-cache hits landing on and beside a state checkpoint. The chunk comes
from the key (`= 64`) or the model directory's config.json; a model with no recurrent state and no
size given is exit 2. The variants themselves are config.py's (`boundary_variants`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from strict_gate.core.model_files import STATE_CHUNKS as CHUNKS
from strict_gate.core.model_files import recurrent_config, resolve_model
from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError

KEY = "state_boundaries"


def _model_dir(engine: Engine) -> Path | None:
    """The model directory an arm's engine serves, where its options name one on this machine."""
    path = getattr(engine, "model_path", None)
    if path is None:
        model = getattr(engine.options, "model", None)
        try:
            path = resolve_model(model, engine.base_dir) if isinstance(model, str) else None
        except ConfigError:
            return None
    return Path(path) if path is not None and (Path(path) / "config.json").is_file() else None


def _config(model_dir: Path) -> dict:
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _chunk(cfg: dict) -> int | None:
    """The kernel's chunk a recurrent model's config gives: known by type, else its `chunk_size` (Mamba2)."""
    known = CHUNKS.get(str(cfg.get("model_type")))
    size = cfg.get("chunk_size")
    return known or (size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None)


def chunk_size(setting: bool | int, engines: Iterable[Engine], *, path: str | None, line: int | None) -> int:
    """The chunk `state_boundaries` cuts at: the key's own number, else the first arm's model's."""
    if setting is not True:
        return int(setting)
    dirs = [d for d in (_model_dir(e) for e in engines) if d is not None]
    if not dirs:
        raise ConfigError(f"[invariance] {KEY} = true: no arm names a model directory with a config.json to read "
                          f"the kernel's chunk from; give it: {KEY} = 64", path=path, line=line)
    cfg, file = _config(dirs[0]), dirs[0] / "config.json"
    if not recurrent_config(cfg):
        raise ConfigError(f"[invariance] {KEY} = true, and the model has no recurrent state ({file}: model_type "
                          f"{cfg.get('model_type')!r}, no linear-attention or Mamba layer): no state crosses a "
                          f"prefill chunk; drop the key, or give a chunk to cut at anyway: {KEY} = 64",
                          path=path, line=line)
    chunk = _chunk(cfg)
    if chunk is None:
        raise ConfigError(f"[invariance] {KEY} = true: {file} (model_type {cfg.get('model_type')!r}) carries a "
                          f"recurrent state and names no kernel chunk size; give it: {KEY} = 64",
                          path=path, line=line)
    return chunk
