"""The hello's dtype vocabulary and the tolerances check-engine judges numbers against.

Prefill (a score request: the whole continuation in one pass) and decode (generate: one token
at a time against a cache) compute the same logprobs in another order, so they differ by the
reduction-order noise of the arm's dtype, and by more only when the two paths compute
differently (a mask, a RoPE offset, a cache that is not what the prompt pass left). Each
tolerance is at least five times the largest gap measured on the shipped adapters in its dtype
(docs/engine-protocol.md, section 4, "score"); a dtype nobody states is judged against the
loosest, and the checklist says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# dtype -> bits of the narrowest format the logits pass through (weights or compute)
FLOAT_DTYPES = {"float64": 64, "float32": 32, "bfloat16": 16, "float16": 16, "fp8": 8, "float8": 8}
INT_DTYPES = {"int16": 16, "int8": 8, "int4": 4}
GGUF_DTYPE = re.compile(r"^i?q([1-8])(_[0-9a-z]+)*$")  # llama.cpp's type names, lower case: q8_0, q4_k_m, iq4_xs

# bits -> nats. Prefill/decode |Δ logprob| check-engine measured on the shipped adapters (2 shared
# x86-64 cores): float32 builds up to 7e-06, 8- to 16-bit ones up to 0.051 (the table in the doc).
TOLERANCES = ((64, 1e-6), (32, 1e-3), (8, 0.25), (0, 0.5))
LOOSEST = TOLERANCES[-1][1]


def dtype_bits(dtype: str) -> int | None:
    """The bits of a dtype of the vocabulary; None for a name outside it."""
    if dtype in FLOAT_DTYPES:
        return FLOAT_DTYPES[dtype]
    if dtype in INT_DTYPES:
        return INT_DTYPES[dtype]
    m = GGUF_DTYPE.match(dtype)
    return int(m.group(1)) if m else None


def vocabulary() -> str:
    return ", ".join([*FLOAT_DTYPES, *INT_DTYPES, "q8_0", "q4_k_m", "..."])


@dataclass(frozen=True)
class Tolerance:
    """How far two computations of one logprob may sit apart in this arm's dtype."""

    nats: float
    dtype: str | None
    source: str  # where the dtype came from: "--dtype", "the hello", "the hf options"

    @classmethod
    def for_dtype(cls, dtype: str | None, source: str) -> Tolerance:
        bits = dtype_bits(dtype) if dtype else None
        if bits is None:
            return cls(LOOSEST, dtype, source)
        return cls(next(nats for floor, nats in TOLERANCES if bits >= floor), dtype, source)

    def describe(self) -> str:
        if self.dtype is None:
            where = "state `dtype` in the hello or " if self.source == "the hello" else ""
            return (f"{self.nats:g} nats: the dtype is not stated ({self.source}), so the loosest tolerance; "
                    f"{where}pass --dtype for a tighter check")
        if dtype_bits(self.dtype) is None:
            return f"{self.nats:g} nats: dtype {self.dtype!r} ({self.source}) is outside the vocabulary, so the loosest"
        return f"{self.nats:g} nats for {self.dtype} ({self.source})"
