"""A gap in units in the last place (ULPs) of a dtype at a value's magnitude.

A bfloat16 number's spacing grows with its magnitude (0.125 in [16, 32), 0.25 in [32, 64)),
so a fixed nat bound reads a one-step rounding of a large logit as a real difference. The
spacing is 2**(e - p) for |x| in [2**e, 2**(e+1)), p the dtype's stored significand bits,
and the subnormal spacing below the smallest normal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FloatFormat:
    name: str
    mantissa_bits: int  # stored significand bits (the leading 1 not counted)
    min_exponent: int  # of the smallest normal number, 2**min_exponent

    def spacing(self, magnitude: float) -> float:
        """The distance from |magnitude| to the next representable number above it."""
        x = abs(magnitude)
        if not math.isfinite(x):
            raise ValueError(f"no spacing at a non-finite magnitude {magnitude!r}")
        e = max(math.frexp(x)[1] - 1, self.min_exponent) if x > 0 else self.min_exponent
        return math.ldexp(1.0, e - self.mantissa_bits)


FORMATS = {
    "bfloat16": FloatFormat("bfloat16", 7, -126),
    "float16": FloatFormat("float16", 10, -14),
    "float32": FloatFormat("float32", 23, -126),
    "float64": FloatFormat("float64", 52, -1022),
}
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
           "fp64": "float64", "double": "float64", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
           "torch.float32": "float32", "torch.float64": "float64"}


def float_format(dtype: str | None) -> FloatFormat | None:
    """The format of a dtype as configs and engines spell it; None for one outside the table
    (an integer or GGUF quantisation has no single float spacing)."""
    if dtype is None:
        return None
    name = ALIASES.get(dtype.lower(), dtype.lower())
    return FORMATS.get(name)


def gap_ulps(gap: float | None, dtype: str | None, magnitude: float | None) -> float | None:
    """`gap` in spacings of `dtype` at `magnitude`; None when any of them is unknown."""
    fmt = float_format(dtype)
    if gap is None or fmt is None or magnitude is None or not math.isfinite(gap):
        return None
    return gap / fmt.spacing(magnitude)
