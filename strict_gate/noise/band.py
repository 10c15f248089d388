"""A gate's `[noise]` table, the fit of a profile to the gate, and the measured band's rule.

```toml
band = "measured"          # the near-tie band from the profile (or a number: the profile annotates only)
[noise]
profile = "../baselines/tiny-llama-vllm-fp32/noise.json"   # default: noise.json in a recorded reference's baseline
floor = 0.05               # nats: the measured band is never below it (default 0: none)
ulps = 2                   # optional: nor below 2 spacings of the dtype at the largest logit magnitude
                           # at a self-flip (the RBLN rule); default 0: off, the band stays explicit
```

The rule, stated in every report that uses it:
  band = max(floor, largest same-build self-flip gap, ulps x spacing(dtype, largest magnitude)).
A profile whose battery, model digest, dtype or engine differs from the gate's, that was
measured over more tokens than the gate judges, or that names no records for a recorded
reference, is refused (exit 2, naming the field), and so is a measured band over self-flips
whose gap no side knows: no number can be measured then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from strict_gate.core.options import Bound, Checked, Parse
from strict_gate.errors import ConfigError
from strict_gate.noise.profile import NoiseProfile
from strict_gate.noise.ulp import float_format


def fmt_nats(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.4g} nats"


@dataclass(frozen=True)
class NoiseKeys(Checked):
    profile: str | None = None
    floor: Annotated[float, Bound(ge=0, unit="nats"), Parse(float)] = 0.0
    ulps: Annotated[float, Bound(ge=0), Parse(float)] = 0.0


@dataclass(frozen=True)
class ArmFacts:
    """What the gate's reference is, to check a profile against: measured the same way when
    the profile is written and when a gate reads it."""

    dtype: str | None
    model: str | None
    model_digest: str | None
    baseline: str | None = None
    baseline_sha256: str | None = None
    engine: str | None = None  # the engine kind (a recorded reference's: its baseline's)
    model_digests: frozenset[str] = frozenset()  # every form of its digest (core/model_files.model_digests)


def fit_problems(profile: NoiseProfile, facts: ArmFacts, battery_sha256: str, max_tokens: int | None = None) -> list[str]:
    """Why this profile does not describe this gate's reference on this battery, each naming the
    profile's field; [] when it does."""
    p = profile.provenance
    out = []
    if p.battery.sha256 != battery_sha256:
        out.append(f"provenance.battery.sha256: it was measured on battery {p.battery.name!r} (sha256 "
                   f"{p.battery.sha256[:12]}...), and the gate's prompt set is sha256 {battery_sha256[:12]}...")
    if facts.model_digest is None or p.model_digest is None:
        out.append("provenance.model_digest: the model digest of the profile or of the gate's reference is unknown, "
                   "so it cannot be checked to be the same model")
    elif p.model_digest not in (facts.model_digests or {facts.model_digest}):
        out.append(f"provenance.model_digest: it profiles model {p.model!r} ({p.model_digest[:24]}...), and the gate's "
                   f"reference is {facts.model!r} ({facts.model_digest[:24]}...)")
    if facts.dtype is None or p.dtype != facts.dtype:
        out.append(f"provenance.dtype: it was measured in dtype {p.dtype}, and the gate's reference runs in "
                   f"{facts.dtype or 'an unstated dtype'}")
    if facts.engine is not None and p.engine != facts.engine:
        out.append(f"provenance.engine: it was measured on engine {p.engine!r}, and the gate's reference is "
                   f"{facts.engine!r} (another engine's noise is not this one's)")
    if facts.baseline_sha256 is not None and p.baseline_sha256 is None:
        out.append("provenance.baseline_sha256: the gate's reference is a stored baseline and the profile names no "
                   "records it was measured on, so a re-captured baseline could not be told")
    elif facts.baseline_sha256 is not None and p.baseline_sha256 != facts.baseline_sha256:
        out.append("provenance.baseline_sha256: the gate's baseline was re-captured after the profile was measured "
                   "(its records differ)")
    if max_tokens is not None and p.max_tokens > max_tokens:
        out.append(f"provenance.max_tokens: it was measured over {p.max_tokens} tokens, and the gate judges "
                   f"{max_tokens}: its flips past position {max_tokens - 1} would set the band")
    return out


@dataclass(frozen=True)
class MeasuredBand:
    value: float
    rule: str  # the rule with its numbers, for every report


def measured_band(profile: NoiseProfile, keys: NoiseKeys, where: str) -> MeasuredBand:
    """The band a `band = "measured"` gate judges by, and its rule in words."""
    same = profile.same_build
    unknown = sum(v.unknown_gaps for v in same)
    if unknown:
        raise ConfigError(f'band = "measured": {unknown} of the reference\'s own self-flips have a gap no side '
                          "knows (the other token outside the top-k), so no band can be measured from them; "
                          "give a number of nats", path=where)
    largest = profile.largest_self_flip_gap
    names = ", ".join(v.name for v in same) or "none"
    terms = [(keys.floor, f"floor {fmt_nats(keys.floor)}")]
    terms.append((largest or 0.0, f"largest self-flip gap {fmt_nats(largest)} over {names}" if largest is not None
                  else f"no self-flip over {names} (0)"))
    fmt = float_format(profile.provenance.dtype)
    if keys.ulps > 0:
        mag = profile.largest_magnitude
        if fmt is None or mag is None:
            raise ConfigError(f"[noise] ulps = {keys.ulps:g}: the profile's dtype ({profile.provenance.dtype}) has no "
                              "float spacing or it holds no flip magnitude", path=where)
        spacing = fmt.spacing(mag)
        terms.append((keys.ulps * spacing, f"{keys.ulps:g} x {fmt.name} spacing {spacing:g} at |{mag:.4g}| "
                      f"(the larger {_of(profile)} at a self-flip)"))
    value = max(t[0] for t in terms)
    rule = f"band = max({', '.join(t[1] for t in terms)}) = {fmt_nats(value)}"
    return MeasuredBand(value, rule)


def _of(profile: NoiseProfile) -> str:
    kinds = {f.magnitude_of for f in profile.self_flips}
    return "raw logit" if kinds == {"logit"} else "|logprob|, the engine gave no raw logits"
