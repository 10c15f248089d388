"""Ask an engine for a dump and distrust what it says it wrote.

Every engine, in process or not, answers a DumpRequest with a DumpReply (a file and the
points in it); the reply is audited like a run before a number is read from it: the file
inside the directory the gate named, a readable safetensors file, the points it lists being
the points it holds and among those asked for, every tensor float32, (positions x width),
finite. Anything else is an engine failure naming the rule (DumpRule).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from strict_gate.engines.base import DumpReply, DumpRequest, Engine
from strict_gate.errors import EngineError
from strict_gate.localize.points import family_of, is_family, is_point

MAX_DUMP_BYTES = 4 * 1024**3  # one prompt's dump; a bigger file is refused before it is read


class DumpRule(StrEnum):
    INSIDE = "the file lies inside the directory the gate named"
    REGULAR = "the file is a regular file of bounded size"
    READABLE = "the file is a safetensors file"
    LISTED = "the reply lists exactly the points the file holds"
    KNOWN = "every point is a canonical point name (a family's name asks for points, it names none)"
    ASKED = "every point was asked for (an expert's down projection: by name or by its family)"
    DTYPE = "every tensor is float32"
    SHAPE = "every tensor is (positions asked for) x width"
    FINITE = "every value is finite"
    NONZERO = "no tensor is all zeros"


class DumpError(EngineError):
    """A dump reply that breaks a rule; the message names the rule and the engine."""

    def __init__(self, engine: str, rule: DumpRule, detail: str):
        self.rule = rule
        super().__init__(f"{engine}: dump reply breaks the rule \"{rule}\": {detail}")


@dataclass(frozen=True)
class Audited:
    """The file the reply named, as the audit read it: its tensors and the digest of its bytes,
    so that a later read compares exactly what was audited (read_back)."""

    path: Path
    digest: str
    tensors: dict[str, Any]


def read_back(audited_file: Audited | Path, digest: str | None = None) -> dict[str, Any]:
    """The tensors of a file the audit saw; a file changed since is refused."""
    from safetensors.torch import load

    path, want = (audited_file.path, audited_file.digest) if isinstance(audited_file, Audited) \
        else (audited_file, digest)
    data = path.read_bytes() if path.is_file() else b""
    if hashlib.sha256(data).hexdigest() != want:
        raise EngineError(f"dump file {path} changed after the audit read it: what was audited is not what "
                          "would be compared")
    return load(data)


def audited(engine_name: str, request: DumpRequest, reply: DumpReply) -> Audited:
    """The reply's file, read once, once every rule holds."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    def fail(rule: DumpRule, detail: str) -> DumpError:
        return DumpError(engine_name, rule, detail)

    directory = Path(request.directory).resolve()
    path = Path(reply.path)
    path = (directory / path if not path.is_absolute() else path)
    if os.path.islink(path) or directory not in path.resolve().parents:
        raise fail(DumpRule.INSIDE, f"{reply.path} (directory {directory})")
    if not path.is_file() or path.stat().st_size > MAX_DUMP_BYTES:
        raise fail(DumpRule.REGULAR, f"{path} is missing, not a file, or over {MAX_DUMP_BYTES} bytes")
    try:
        data = path.read_bytes()
        tensors = load(data)
    except (SafetensorError, OSError, ValueError) as e:
        raise fail(DumpRule.READABLE, f"{path}: {e}") from None
    if sorted(tensors) != sorted(reply.points) or len(set(reply.points)) != len(reply.points):
        raise fail(DumpRule.LISTED, f"the reply lists {sorted(reply.points)}, the file holds {sorted(tensors)}")
    unknown = [p for p in tensors if not is_point(p) or is_family(p)]
    if unknown:
        raise fail(DumpRule.KNOWN, f"{unknown}")
    asked = set(request.points or ())
    if request.points is not None and (extra := sorted(p for p in tensors if p not in asked
                                                       and family_of(p) not in asked)):
        raise fail(DumpRule.ASKED, f"{extra} were not asked for")
    n = len(request.positions)
    for name, t in tensors.items():
        if str(t.dtype) != "torch.float32":
            raise fail(DumpRule.DTYPE, f"{name} is {str(t.dtype).removeprefix('torch.')}")
        if t.dim() != 2 or t.shape[0] != n or t.shape[1] == 0:
            raise fail(DumpRule.SHAPE, f"{name} has shape {tuple(t.shape)}, expected ({n}, width)")
        if not bool(t.isfinite().all()):
            raise fail(DumpRule.FINITE, f"{name} holds NaN or infinity")
        if not bool(t.any()):
            raise fail(DumpRule.NONZERO, f"{name} is all zeros: no activation is")
    return Audited(path, hashlib.sha256(data).hexdigest(), tensors)


def capture(engine: Engine, request: DumpRequest) -> Audited:
    """One dump from one engine, audited; the directory is made fresh and empty."""
    Path(request.directory).mkdir(parents=True, exist_ok=False)
    with engine.scoped_env():
        reply = engine.dump(request)
    return audited(f"{engine.kind} engine", request, reply)
