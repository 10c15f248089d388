"""The `[invariance]` table of a gate config: which arms, which variants, which policy.

```toml
[invariance]
arms = ["candidate"]            # default; "reference" too checks the oracle itself
batch = [1, 8, 32]              # prompts submitted together (1: a re-run, run-to-run determinism)
concurrency = [8]               # requests in flight at once (servers, command engines that declare it)
chunked_prefill = [0, 64, 256]  # prompt tokens prefilled per step; 0: the whole prompt in one step
prefix_cache = true             # each prompt again after a prompt sharing all but its last token
needle = true                   # each prompt inside a batch of others, random size and position
speculative = [{ method = "ngram", num_speculative_tokens = 3 }]  # speculative decoding on: exact, always
state_boundaries = true         # prefill cut around a recurrent model's kernel chunk (or = 64), prefix
state_block = 64                #   hits on and beside its state checkpoint (default: the chunk)
repeats = 1                     # every variant K times; distinct outputs per prompt are counted
policy = "informational"        # strict | near-tie | informational (never changes the exit code)
seed = 0                        # of the needle batches
```

Every value is checked when the config is read, before any engine starts: an unknown key or
variant, batch 0, a chunk beyond the arm's context, a variant an arm's engine cannot serve,
each an exit 2 naming the file and line. A speculative variant is judged exactly whatever the
policy says of near-ties (a greedy speculator is lossless by construction): under a strict or
near-tie policy any token it changes fails the variant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from strict_gate.core.features import TableContext
from strict_gate.core.options import Checked, NonNegativeInt, Parse, PositiveInt, Rule, did_you_mean, parse_options
from strict_gate.engines.base import Engine, Serving
from strict_gate.engines.speculative import Speculation, read_speculations
from strict_gate.errors import ConfigError
from strict_gate.invariance.boundaries import KEY as BOUNDARIES
from strict_gate.invariance.boundaries import chunk_size

ARMS = ("candidate", "reference")
DEFAULT_NEEDLE_MAX = 8  # the largest needle batch when no `batch` list names one


class VariantKind(StrEnum):
    """A variant as an [invariance] key spells it; BASELINE is the arm's own batch-1 run."""

    BASELINE = "baseline"
    BATCH = "batch"
    CONCURRENCY = "concurrency"
    CHUNKED_PREFILL = "chunked_prefill"
    PREFIX_CACHE = "prefix_cache"
    NEEDLE = "needle"
    SPECULATIVE = "speculative"


# what each variant asks of an engine
SERVING = {
    VariantKind.BATCH: Serving.BATCH,
    VariantKind.CONCURRENCY: Serving.CONCURRENCY,
    VariantKind.CHUNKED_PREFILL: Serving.CHUNKED_PREFILL,
    VariantKind.PREFIX_CACHE: Serving.PREFIX_CACHE,
    VariantKind.NEEDLE: Serving.BATCH,
    VariantKind.SPECULATIVE: Serving.SPECULATIVE,
}


class InvariancePolicy(StrEnum):
    STRICT = "strict"  # every variant's tokens equal the batch-1 run's
    NEAR_TIE = "near-tie"  # a variant may flip a near-tie (both runs' gaps within the band)
    INFORMATIONAL = "informational"  # figures only: the exit code is the token verdict's


def check_invariance_policy(text: str) -> InvariancePolicy:
    known = [p.value for p in InvariancePolicy]
    if text not in known:
        raise ValueError(f"[invariance] unknown policy {text!r}{did_you_mean(text, known)}; choose one of: "
                         f"{', '.join(known)}")
    return InvariancePolicy(text)


def _distinct(low: int) -> Rule:
    return Rule(lambda v: all(x >= low for x in v) and len(set(v)) == len(v),
                f"must be a list of distinct integers >= {low}")


def _arms_ok(v: list[str]) -> bool:
    return bool(v) and len(set(v)) == len(v) and set(v) <= set(ARMS)


# the annotations below are strings (from __future__), read back at module level: plain names only
ArmList = Annotated[list[str], Rule(_arms_ok, f"must be a non-empty list of distinct arms, each one of {', '.join(ARMS)}")]
Sizes = Annotated[list[int], _distinct(1)]
Chunks = Annotated[list[int], _distinct(0)]


@dataclass(frozen=True)
class InvarianceKeys(Checked):
    arms: ArmList = field(default_factory=lambda: ["candidate"])
    batch: Sizes = field(default_factory=list)
    concurrency: Sizes = field(default_factory=list)
    chunked_prefill: Chunks = field(default_factory=list)
    prefix_cache: bool = False
    state_boundaries: bool | PositiveInt = False  # true: the chunk from the model's config.json
    state_block: PositiveInt | None = None  # the prefix cache's state checkpoint; None: the chunk
    needle: bool = False
    speculative: Annotated[list[Speculation], Parse(read_speculations, takes=list)] = field(default_factory=list)
    repeats: PositiveInt = 1
    policy: Annotated[InvariancePolicy, Parse(check_invariance_policy, takes=str)] = InvariancePolicy.INFORMATIONAL
    seed: NonNegativeInt = 0


@dataclass(frozen=True)
class Variant:
    kind: VariantKind
    size: int | None = None  # batch size, requests in flight, prefill chunk, cached prefix; None for the others
    spec: Speculation | None = None  # the speculative variant's configuration
    label: str | None = None  # a state-boundary variant's name ("prefill-cut-64", "prefix-at-64")

    @property
    def name(self) -> str:
        if self.spec is not None:
            return self.spec.name
        if self.label is not None:
            return self.label
        return str(self.kind) if self.size is None else f"{self.kind}-{self.size}"

    @property
    def key(self) -> str:
        """The [invariance] key that asked for it, for an error's line."""
        return BOUNDARIES if self.label is not None else str(self.kind)

    @property
    def where_served(self) -> bool:
        """A state-boundary prefix hit: run only on an arm that serves a prefix cache, left out on
        the others instead of refused (an hf reference has none, vLLM has), each on a fresh engine
        of its own (run.py's _engines)."""
        return self.label is not None and self.kind == VariantKind.PREFIX_CACHE

    @property
    def exact(self) -> bool:
        """Judged exactly under any failing policy: a lossless speculator flips not even a near-tie."""
        return self.kind == VariantKind.SPECULATIVE


BASELINE = Variant(VariantKind.BASELINE)


@dataclass(frozen=True)
class InvarianceConfig:
    arms: tuple[str, ...]
    variants: tuple[Variant, ...]
    repeats: int = 1
    policy: InvariancePolicy = InvariancePolicy.INFORMATIONAL
    seed: int = 0
    needle_max: int = DEFAULT_NEEDLE_MAX  # needle batches hold 2 to needle_max prompts
    # (arm, variant name) of a Variant.where_served its arm's engine, as built, does not serve
    unserved: frozenset[tuple[str, str]] = frozenset()

    def to_json(self) -> dict:
        return {"arms": list(self.arms), "variants": [v.name for v in self.variants], "repeats": self.repeats,
                "policy": self.policy.value, "seed": self.seed, "needle_max": self.needle_max,
                "speculative": [v.spec.to_json() for v in self.variants if v.spec is not None]}


def boundary_variants(chunk: int, block: int) -> tuple[Variant, ...]:
    """The prefill cut inside the chunk (chunk/4, chunk/2), one before, at and one after it; then a
    cached prefix one before, on and one after the state checkpoint `block` (boundaries.py says why)."""
    cuts = sorted({n for n in (chunk // 4, chunk // 2, chunk - 1, chunk, chunk + 1) if n >= 1})
    out = [Variant(VariantKind.CHUNKED_PREFILL, n, label=f"prefill-cut-{n}") for n in cuts]
    out += [Variant(VariantKind.PREFIX_CACHE, n, label=f"prefix-{'at' if n == block else 'off'}-{n}")
            for n in (block - 1, block, block + 1) if n >= 1]
    return tuple(out)


def _variants(keys: InvarianceKeys, chunk: int | None = None) -> tuple[Variant, ...]:
    out = [Variant(VariantKind.BATCH, n) for n in keys.batch]
    out += [Variant(VariantKind.CONCURRENCY, n) for n in keys.concurrency]
    out += [Variant(VariantKind.CHUNKED_PREFILL, n) for n in keys.chunked_prefill]
    out += [Variant(VariantKind.PREFIX_CACHE)] if keys.prefix_cache else []
    out += [Variant(VariantKind.NEEDLE)] if keys.needle else []
    out += [Variant(VariantKind.SPECULATIVE, spec=s) for s in keys.speculative]
    out += boundary_variants(chunk, keys.state_block or chunk) if chunk else []
    return tuple(out)


def parse_invariance(table: object, arms: Mapping[str, Callable[[], Engine]], line_of) -> InvarianceConfig:
    """`[invariance]`, checked against the named arms' engines (built, not started): each variant
    must be one the arm's kind can serve, each chunk within its context where that is known.
    `arms` builds the gate's arm engines by role."""
    path = getattr(line_of, "path", None)
    if not isinstance(table, dict):
        raise ConfigError("[invariance] must be a table", path=path, line=line_of("invariance"))
    keys = parse_options(InvarianceKeys, table, where="invariance", line_of=line_of)
    built = {arm: build() for arm in keys.arms if (build := arms.get(arm)) is not None}
    variants = _variants(keys, _boundary_chunk(keys, arms, built, line_of))
    if not variants:
        raise ConfigError("[invariance] names no variant: give batch, concurrency, chunked_prefill, "
                          f"prefix_cache, needle, speculative or {BOUNDARIES}", path=path, line=line_of("invariance"))
    for arm in keys.arms:
        _check_arm(arm, built.get(arm), variants, line_of)
    unserved = frozenset((arm, v.name) for arm, e in built.items() for v in variants
                         if v.where_served and SERVING[v.kind] not in e.servings)
    return InvarianceConfig(tuple(keys.arms), variants, keys.repeats, keys.policy, keys.seed,
                            max([n for n in keys.batch if n > 1], default=DEFAULT_NEEDLE_MAX), unserved)


def _boundary_chunk(keys: InvarianceKeys, arms: Mapping[str, Callable[[], Engine]], built: Mapping[str, Engine],
                    line_of) -> int | None:
    """The chunk state_boundaries cuts at, None when it is off; the reference's model (else the
    candidate's) is read only for `true`."""
    path = getattr(line_of, "path", None)
    if keys.state_block is not None and not keys.state_boundaries:
        raise ConfigError(f"[invariance] state_block without {BOUNDARIES}: it places the prefix hits "
                          f"{BOUNDARIES} makes; add {BOUNDARIES} = true", path=path, line=line_of("state_block"))
    if not keys.state_boundaries:
        return None
    models = (built.get(a) or arms[a]() for a in ("reference", "candidate") if a in arms)
    return chunk_size(keys.state_boundaries, models, path=path, line=line_of(BOUNDARIES))


def _check_arm(arm: str, engine: Engine | None, variants: tuple[Variant, ...], line_of) -> None:
    path = getattr(line_of, "path", None)
    if engine is None:
        raise ConfigError(f"[invariance] arms names {arm!r}, and the gate has no [{arm}] table"
                          f"{did_you_mean(arm, ARMS)}", path=path, line=line_of("arms"))
    if not engine.measurable:
        raise ConfigError(f"[invariance] the [{arm}] arm is a stored run (kind = {engine.kind!r}): it serves "
                          "nothing, so it has no variant to run; drop it from arms", path=path, line=line_of("arms"))
    for v in variants:
        if SERVING[v.kind] not in engine.servings and not v.where_served:
            can = ", ".join(sorted(k for k, s in SERVING.items() if s in engine.servings)) or "none"
            what = f"{BOUNDARIES} ({v.name}, a {v.kind} variant)" if v.label else str(v.kind)
            raise ConfigError(f"[invariance] {what} cannot run on the [{arm}] arm: a {engine.kind!r} engine "
                              f"cannot serve it (its variants: {can})", path=path, line=line_of(v.key))
    context = engine.speed_settings().get("max_context")
    for v in variants:
        if v.kind == VariantKind.CHUNKED_PREFILL and isinstance(context, int) and v.size is not None \
                and v.size > context:
            raise ConfigError(f"[invariance] {v.key} {v.size} is beyond the [{arm}] arm's context of "
                              f"{context} tokens", path=path, line=line_of(v.key))


def from_gate(ctx: TableContext) -> InvarianceConfig | None:
    """The gate config's `[invariance]` (core/features.py's registry calls it), checked against the
    reference's and candidate's engines (built, not started)."""
    if "invariance" not in ctx.data:
        return None
    builders = {role: arm.build_in_driver for role, arm in ctx.arms.items() if role in ("reference", "candidate")}
    return parse_invariance(ctx.data["invariance"], builders, ctx.lines.table("invariance"))


def of(cfg: Any) -> InvarianceConfig | None:
    """A gate config's invariance settings (gate/config.py's GateConfig.features)."""
    s = cfg.feature("invariance")
    return s if isinstance(s, InvarianceConfig) else None
