"""The matched-config check: are the two arms timed under the same conditions?

By construction both arms get the same rungs, concurrency and prompt ids; what the engines
did with them is checked from their records (the prompt ids they echo, the tokens they
generated). Engine settings that move speed are compared where both arms state them
(Engine.speed_settings: dtype, eager vs compiled / CUDA graphs, KV-cache sizing, prefix
caching, the device type, the attention backend); a setting one arm does not state is listed as
unchecked, never assumed equal. Attention backends are named in each engine's own vocabulary
(vLLM's FLASH_ATTN, transformers' sdpa), so they are compared between arms of one engine kind;
across kinds both are stated in a note, and "auto" (vLLM's selector, not read back) is unstated.

A difference is a Mismatch; it is `flattering` when it makes the candidate's ratio look
better than a matched run would: a reference in eager mode against a compiled candidate (a
slow denominator), a candidate in a narrower dtype, prefix caching on the candidate only.
Eager against compiled is flagged in both directions (the ratio then compares compilation,
not engines); the other opposite differences are reported as plain mismatches. A flattering
mismatch makes the speed verdict not comparable (verdict.judge_speed): it is never a pass.
Another device type is flagged in both directions: the ratio then compares hardware.
"""

from __future__ import annotations

import statistics

from strict_gate.speed.measure import ArmMeasurement
from strict_gate.speed.model import Mismatch, Rung

DTYPE_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16, "fp8": 8, "float8": 8, "int8": 8, "int4": 4}
SETTINGS = ("dtype", "eager", "kv_cache", "prefix_cache", "device", "attention_backend")
UNSTATED = ("auto", "")  # a value that says vLLM chose at run time, not what it chose


def _setting(name: str, ref, cand) -> Mismatch:
    flattering, why = False, ""
    if name == "eager":
        # Flagged both ways: either way the ratio measures compilation, not the engine.
        flattering = isinstance(ref, bool) and isinstance(cand, bool) and ref != cand
        why = ("an eager reference against a compiled candidate: a flattering denominator" if ref is True
               else "a compiled reference against an eager candidate: the ratio measures compilation, "
                    "not the engine (it understates the candidate)")
    elif name == "dtype":
        rb, cb = DTYPE_BITS.get(str(ref)), DTYPE_BITS.get(str(cand))
        flattering = rb is not None and cb is not None and cb < rb
        why = "the candidate computes in a narrower dtype" if flattering else "the arms compute in different dtypes"
    elif name == "device":
        flattering = True  # either way the ratio measures the hardware, not the engine
        why = "the arms run on different devices: the ratio compares hardware, not engines"
    elif name == "attention_backend":
        why = "the arms use different attention backends"
    elif name == "prefix_cache":
        flattering = cand is True and ref is False
        why = "prefix caching on the candidate only" if flattering else "prefix caching on the reference only"
    else:
        why = "the arms size their KV cache differently"
    return Mismatch(name, ref, cand, flattering, why)


def compared_rungs(ref: ArmMeasurement, cand: ArmMeasurement, rungs: tuple[Rung, ...]) -> tuple[str, ...]:
    """The rungs measured on both arms without an error: the only ones whose outputs can be compared."""
    out = []
    for rung in rungs:
        a, b = ref.rungs.get(rung.name), cand.rungs.get(rung.name)
        if a is not None and b is not None and not a.error and not b.error and a.reps and b.reps:
            out.append(rung.name)
    return tuple(out)


def check_matched(ref: ArmMeasurement, cand: ArmMeasurement, rungs: tuple[Rung, ...]
                  ) -> tuple[tuple[Mismatch, ...], tuple[str, ...]]:
    """(mismatches, notes) for two measured arms."""
    out: list[Mismatch] = []
    notes: list[str] = []
    unknown = []
    for name in SETTINGS:
        r, c = ref.settings.get(name), cand.settings.get(name)
        if r in UNSTATED or c in UNSTATED:
            r = c = None
        if r is None or c is None:
            unknown.append(name)
        elif name == "attention_backend" and ref.kind != cand.kind:
            notes.append(f"attention backend: reference ({ref.kind}) {r}, candidate ({cand.kind}) {c}: each engine "
                         "names its own kernels, so stated, not compared")
        elif r != c:
            out.append(_setting(name, r, c))
    if unknown:
        notes.append(f"matched check: {', '.join(unknown)} not stated by both arms, not checked")
    for name in compared_rungs(ref, cand, rungs):
        a, b = ref.rungs[name], cand.rungs[name]
        if a.prompt_sha256 != b.prompt_sha256:
            out.append(Mismatch("prompt_set", a.prompt_sha256, b.prompt_sha256, False,
                                f"rung {name}: the engines echo different prompt ids (re-tokenized or truncated)"))
        ta = int(statistics.median(a.tokens_per_seq)) if a.tokens_per_seq else 0
        tb = int(statistics.median(b.tokens_per_seq)) if b.tokens_per_seq else 0
        if ta != tb:
            out.append(Mismatch("output_tokens", ta, tb, False,
                                f"rung {name}: the arms generated different lengths "
                                "(an engine that does not honour ignore_eos stopped early)"))
    return tuple(out), tuple(notes)
