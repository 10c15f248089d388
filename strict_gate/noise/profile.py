"""The noise profile on disk (strict-gate/noise@1): what it holds, its seal, its one reader.

A profile is read back by a gate to set its band, so it is distrusted like any input: decoded
by msgspec into the shapes below (a wrong type or an unknown field is refused), its seal (a
sha256 over the canonical JSON of everything else) must match, and its figures must agree
with its flips (each variation's counts, the largest gap). The seal catches a profile edited
or mixed up by hand; it is a checksum, not a signature against someone who recomputes it.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated

import msgspec

from strict_gate.errors import InputError
from strict_gate.runs.records import write_text_atomic

NOISE_SCHEMA = "strict-gate/noise@1"
PROFILE_NAME = "noise.json"  # beside the baseline's manifest.json and records.jsonl
MAX_PROFILE_BYTES = 64 << 20

Count = Annotated[int, msgspec.Meta(ge=0)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class _Struct(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Stored shapes are read-only values; a field this version does not know is refused."""


class SelfFlip(_Struct, frozen=True, kw_only=True):
    """One position where the reference chose another token under a variation that should not
    matter. Side a is the base run (the first captured run, or the decode), side b the variant."""

    variation: str
    id: str
    position: Count
    tokens: tuple[TokenId, TokenId]  # (a's token, b's token)
    gaps: tuple[float | None, float | None]  # lp_a(a) - lp_a(b), lp_b(b) - lp_b(a); None: outside that side's top-k
    gap: float | None  # the larger known |gap|; None when neither side knows it
    tie: bool  # a side saw the two tokens at exactly the same logprob
    logprobs: tuple[float | None, float | None]  # side a's logprobs of the two tokens
    logits: tuple[float, float] | None = None  # raw logits of the two tokens, where the engine gave them
    magnitude: float | None  # |value| the spacing is taken at: the larger raw logit, else the larger |logprob|
    magnitude_of: str  # "logit" or "logprob": which value `magnitude` is
    ulps: float | None  # gap in spacings of the profile's dtype at `magnitude`


class Variation(_Struct, frozen=True, kw_only=True):
    name: str  # runs-5, batch-8, prefill-decode, chunked_prefill-16, build:<config name>
    kind: str  # runs | batch | prefill_decode | chunked_prefill | second_build
    same_build: bool  # the reference itself (its band counts these); False: another build of it
    detail: str  # what was run, in words
    prompts: Count  # prompts compared
    prompts_flipped: Count
    positions: Count  # positions compared
    flips: Count
    largest_gap: float | None
    unknown_gaps: Count  # flips whose gap no side knows (the other token outside the top-k)


class Battery(_Struct, frozen=True, kw_only=True):
    name: str
    sha256: str
    count: Count


class Provenance(_Struct, frozen=True, kw_only=True):
    battery: Battery
    model: str  # as the config names it
    model_digest: str | None  # core/model_files.py's digest of the model files
    dtype: str
    engine: str  # kind
    versions: dict[str, str]
    k: Count  # runs per prompt of the baseline (or of the live capture)
    baseline: str | None  # the baseline directory the K runs came from, as given
    baseline_sha256: str | None  # of its records.jsonl: a re-captured baseline needs a new profile
    max_tokens: Count
    top_logprobs: Count
    created: str
    notes: list[str] = []


class ExactTie(_Struct, frozen=True, kw_only=True):
    id: str
    position: Count
    tokens: tuple[TokenId, TokenId]
    logprob: float


class NoiseProfile(_Struct, frozen=True, kw_only=True):
    schema: str
    provenance: Provenance
    variations: list[Variation]
    self_flips: list[SelfFlip]
    largest_self_flip_gap: float | None  # over the same-build variations' known gaps
    largest_magnitude: float | None  # the largest `magnitude` at a same-build flip
    exact_ties: list[ExactTie]  # the base run's steps whose top two logprobs are equal
    seal: str = ""

    @property
    def same_build(self) -> list[Variation]:
        return [v for v in self.variations if v.same_build]

    def flips_of(self, variation: str) -> list[SelfFlip]:
        return [f for f in self.self_flips if f.variation == variation]


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def seal_of(body: dict) -> str:
    """The seal over a profile's JSON without its `seal` field."""
    return "sha256:" + hashlib.sha256(_canonical({k: v for k, v in body.items() if k != "seal"})).hexdigest()


def largest(gaps: list[float | None]) -> float | None:
    known = [g for g in gaps if g is not None]
    return max(known) if known else None


def sealed(profile: NoiseProfile) -> NoiseProfile:
    """The profile with its largest gap and magnitude recomputed from its flips, and sealed."""
    same = {v.name for v in profile.variations if v.same_build}
    flips = [f for f in profile.self_flips if f.variation in same]
    p = msgspec.structs.replace(profile, largest_self_flip_gap=largest([f.gap for f in flips]),
                                largest_magnitude=largest([f.magnitude for f in flips]), seal="")
    return msgspec.structs.replace(p, seal=seal_of(msgspec.to_builtins(p)))


def write_profile(profile: NoiseProfile, path: Path) -> NoiseProfile:
    """Seal and write atomically: a torn write never reads as a profile."""
    done = sealed(profile)
    write_text_atomic(path, json.dumps(msgspec.to_builtins(done), indent=1, allow_nan=False) + "\n")
    return done


def load_profile(path: Path) -> NoiseProfile:
    """Read, type-check, check the seal and the figures; InputError (exit 2) names the file."""
    where = str(path)
    if not path.is_file():
        raise InputError("no noise profile here; measure one with `strict-gate noise CONFIG`", path=where)
    if path.stat().st_size > MAX_PROFILE_BYTES:
        raise InputError(f"the noise profile is over {MAX_PROFILE_BYTES >> 20} MiB", path=where)
    try:
        raw = json.loads(path.read_bytes(), parse_constant=_refuse_constant, parse_float=_finite)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InputError(f"the noise profile is not JSON: {e}", path=where) from None
    if not isinstance(raw, dict) or raw.get("schema") != NOISE_SCHEMA:
        got = raw.get("schema") if isinstance(raw, dict) else type(raw).__name__
        raise InputError(f"not a noise profile: schema {got!r}, expected {NOISE_SCHEMA!r}", path=where)
    if raw.get("seal") != seal_of(raw):
        raise InputError("the noise profile's seal does not match its contents: it was edited after it was "
                         "measured; measure it again with `strict-gate noise`", path=where)
    try:
        profile = msgspec.convert(raw, NoiseProfile)
    except msgspec.ValidationError as e:
        raise InputError(f"the noise profile is malformed: {e}", path=where) from None
    _check_figures(profile, where)
    return profile


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a profile may hold")


def _finite(text: str) -> float:
    """A float as the JSON spells it, refused where it overflows (`1e999` reads as inf, which
    neither the seal's canonical JSON nor a band can hold)."""
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text} is out of a float's range: not a number a profile may hold")
    return x


SECOND_BUILD = "second_build"  # the one kind of variation that is another oracle, not the reference's own noise
K_RUNS = "runs"  # the variation read from a baseline's K captured runs
GAP_EPS = 1e-9


def _side_a_gap(f: SelfFlip) -> float | None:
    """Side a's gap as its logprobs of the two tokens give it (noise/flips.py's rule)."""
    a, b = f.logprobs
    return None if a is None or b is None else max(0.0, a - b)


def _check_kinds(p: NoiseProfile, where: str) -> None:
    """A second build is never the reference's own noise, and nothing else is a second build:
    a resealed `same_build` would fold another oracle's flips into the band."""
    for i, v in enumerate(p.variations):
        other = v.kind == SECOND_BUILD
        if v.same_build == other or v.name.startswith("build:") != other:
            raise InputError(f"variations[{i}].same_build: variation {v.name!r} of kind {v.kind!r} says same_build = "
                             f"{str(v.same_build).lower()}; a {SECOND_BUILD} (named build:...) is another build, "
                             "every other kind the reference itself", path=where)


def _check_figures(p: NoiseProfile, where: str) -> None:
    """Every stated figure agrees with the flips it summarises."""
    names = [v.name for v in p.variations]
    if len(set(names)) != len(names):
        raise InputError("the noise profile names a variation twice", path=where)
    _check_kinds(p, where)
    for f in p.self_flips:
        if f.variation not in names:
            raise InputError(f"self-flip {f.id}@{f.position} belongs to no variation ({f.variation!r})", path=where)
        if f.tokens[0] == f.tokens[1]:
            raise InputError(f"self-flip {f.id}@{f.position} flips a token to itself", path=where)
        if any(g is not None and (not math.isfinite(g) or g < 0) for g in (*f.gaps, f.gap)):
            raise InputError(f"self-flip {f.id}@{f.position} has a gap that is not a finite number >= 0", path=where)
        if f.gap != largest(list(f.gaps)):
            raise InputError(f"self-flip {f.id}@{f.position}: gap {f.gap} is not the larger of its sides' gaps",
                             path=where)
    for v in p.variations:
        flips = p.flips_of(v.name)
        stated = (v.flips, v.prompts_flipped, v.largest_gap, v.unknown_gaps)
        real = (len(flips), len({f.id for f in flips}), largest([f.gap for f in flips]),
                sum(f.gap is None for f in flips))
        if stated != real or v.prompts_flipped > v.prompts or v.flips > v.positions:
            raise InputError(f"variation {v.name!r} states (flips, prompts, largest gap, unknown) {stated}, and its "
                             f"self-flips hold {real}", path=where)
    want = sealed(msgspec.structs.replace(p, seal=""))
    if (want.largest_self_flip_gap, want.largest_magnitude) != (p.largest_self_flip_gap, p.largest_magnitude):
        raise InputError("the noise profile's largest self-flip gap or magnitude disagrees with its flips", path=where)
    for i, f in enumerate(p.self_flips):
        side_a = _side_a_gap(f)
        if (side_a is None) != (f.gaps[0] is None) or (side_a is not None and abs(side_a - (f.gaps[0] or 0.0)) > GAP_EPS):
            raise InputError(f"self_flips[{i}].gaps: self-flip {f.id}@{f.position} states side a's gap {f.gaps[0]} and "
                             f"its logprobs {list(f.logprobs)} give {side_a}", path=where)
