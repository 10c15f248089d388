"""The device an in-process engine computes on, for its manifest: the device type (cpu, cuda,
...), and on a GPU its name, compute capability, driver and CUDA versions.

A baseline captured on a CPU and judged against a CUDA run differs by the device before it
differs by anything else (report/device_view.py names it), so every manifest states it. torch
is imported only when called (from info(), after the engine loaded it); nvidia-smi is asked for
the driver with a short timeout. Nothing here ever fails: a fact it cannot read is left out,
and a reader says "not stated", never "matched".
"""

from __future__ import annotations

import shutil
import subprocess

# The keys of a manifest's `device` object (EngineInfo.options["device"]).
TYPE, NAME, CAPABILITY, DRIVER, CUDA = "type", "gpu_name", "compute_capability", "driver_version", "cuda_version"


def device_type(device: str | None) -> str | None:
    """"cuda:1" -> "cuda"; None or "" -> None (not stated)."""
    if not device:
        return None
    return str(device).split(":", 1)[0].strip().lower() or None


def _driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi (first GPU); None without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first and first[0].strip() else None


def _gpu_facts(index: int) -> dict:
    """Name, compute capability and CUDA version of GPU `index` from torch (already imported by
    the engine: importing it here costs nothing then); {} when torch or CUDA is absent."""
    try:
        import torch
    except Exception:
        return {}
    out: dict = {}
    if getattr(torch.version, "cuda", None):
        out[CUDA] = str(torch.version.cuda)
    try:
        if torch.cuda.is_available():
            out[NAME] = str(torch.cuda.get_device_name(index))
            major, minor = torch.cuda.get_device_capability(index)
            out[CAPABILITY] = f"{major}.{minor}"
    except Exception:  # a broken driver, an index out of range: the facts stay unstated
        pass
    return out


def device_facts(device: str | None) -> dict:
    """The manifest's `device` object for an engine computing on `device` ("cpu", "cuda:0").
    {} when the device is not known (then a reader says "device not stated")."""
    kind = device_type(device)
    if kind is None:
        return {}
    out: dict = {TYPE: kind}
    if kind == "cuda":
        index = int(str(device).split(":", 1)[1]) if ":" in str(device) and str(device).split(":", 1)[1].isdigit() else 0
        out |= _gpu_facts(index)
        driver = _driver_version()
        if driver:
            out[DRIVER] = driver
    return out
