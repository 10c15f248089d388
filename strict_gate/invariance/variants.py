"""A variant as an engine: the arm's engine, serving the prompts the variant's way.

The gate's own runner (gate/arm.py's run_arm) drives it, so a variant's run is an ordinary run
directory, written record by record and audited like any arm's. Only the way prompts reach
the engine differs: one at a time (the batch-1 baseline, chunked prefill), in batches, with
requests in flight, after a prompt that shares the prefix, or hidden in a batch of others; a
speculative variant serves them one at a time, on an engine that drafts and verifies.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import replace

from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import EngineError
from strict_gate.invariance.config import SERVING, Variant, VariantKind
from strict_gate.runs.records import EngineInfo, Record, Sampling

WARM_SUFFIX = "~prefix"  # the id of the prompt served first in the prefix-cache variant


def prefix_sharer(p: PromptInput, length: int | None = None) -> PromptInput:
    """A prompt sharing p's first `length` tokens (None: all but the last): serving it leaves p's
    prefix in the cache, for a state-boundary variant a hit on or beside a state checkpoint."""
    return PromptInput(id=p.id + WARM_SUFFIX, token_ids=p.token_ids[:length or -1] or p.token_ids)


def needle_batches(prompts: Sequence[PromptInput], max_size: int, seed: int) -> list[tuple[PromptInput, list]]:
    """(needle, its batch) per prompt: 2 to max_size prompts, the needle at a random place among
    others drawn from the set (seeded, so a night repeats the last one's batches)."""
    rng = random.Random(seed)
    out = []
    for p in prompts:
        others = [q for q in prompts if q.id != p.id]
        size = rng.randint(2, max(2, max_size))
        group = rng.sample(others, min(size - 1, len(others)))
        group.insert(rng.randint(0, len(group)), p)
        out.append((p, group))
    return out


def unexercised(v: Variant, prompts: Sequence[PromptInput]) -> str | None:
    """Why the variant, on this prompt set, cannot exercise what it names (None: it can). A batch
    of 8 over one prompt serves batches of one; a chunk of 256 never splits a 40-token prompt: such
    a run passes whatever the engine does, so it is incomplete, never a pass."""
    n, longest = len(prompts), max((len(p.token_ids) for p in prompts), default=0)
    if n < 2 and (v.kind == VariantKind.NEEDLE or (v.kind in (VariantKind.BATCH, VariantKind.CONCURRENCY)
                                                     and (v.size or 1) > 1)):
        return (f"{v.name} could not exercise what it names: the prompt set has {n} prompt"
                f"{'' if n == 1 else 's'}, so every request was served alone")
    if v.kind == VariantKind.CHUNKED_PREFILL and v.size and longest <= v.size:
        return (f"{v.name} could not exercise what it names: no prompt is longer than {v.size} tokens (the "
                f"longest has {longest}), so no prefill was split into chunks")
    if v.kind == VariantKind.PREFIX_CACHE and v.size and longest <= v.size:
        return (f"{v.name} could not exercise what it names: no prompt is longer than {v.size} tokens (the "
                f"longest has {longest}), so no cached prefix of {v.size} was followed by more")
    if v.kind == VariantKind.PREFIX_CACHE and longest < 2:
        return f"{v.name} could not exercise what it names: no prompt has two tokens, so none shares a prefix"
    return None


class VariantEngine(Engine):
    """Delegates everything to `inner` but generate(), which serves the variant's way."""

    kind = "variant"
    Options = dict

    def __init__(self, inner: Engine, variant: Variant, *, needle_max: int = 8, seed: int = 0):
        super().__init__({}, inner.env, inner.base_dir)
        self.inner, self.variant = inner, variant
        self.needle_max, self.seed = needle_max, seed
        self.kind = inner.kind  # type: ignore[misc]  # messages name the real engine
        self.in_process = inner.in_process  # type: ignore[misc]
        self.writes_log = inner.writes_log  # type: ignore[misc]
        self.log_libraries = inner.log_libraries  # type: ignore[misc]

    def set_log_path(self, path) -> None:
        self.inner.set_log_path(path)

    def scoped_env(self):
        return self.inner.scoped_env()

    def start(self) -> None:
        self.inner.start()

    def info(self) -> EngineInfo:
        """The inner engine's, with the variant named and, for a chunked prefill or a sized prefix
        hit, its size: the run's manifest says how it was served, whatever the engine records."""
        info = self.inner.info()
        served = {"prefill_chunk": VariantKind.CHUNKED_PREFILL, "cached_prefix": VariantKind.PREFIX_CACHE}
        sizes = {k: self.variant.size for k, kind in served.items() if self.variant.kind == kind and self.variant.size}
        return replace(info, options=dict(info.options) | {"invariance_variant": self.variant.name} | sizes)

    def tokenize(self, text: str) -> list[int]:
        return self.inner.tokenize(text)

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        kind, size, inner = self.variant.kind, self.variant.size, self.inner
        needed = SERVING.get(kind)
        if needed is not None and needed not in inner.servings:  # a command engine's hello narrowed them
            serves = ", ".join(sorted(str(s) for s in inner.servings)) or "none of them"
            raise EngineError(f"the {self.variant.name} variant needs an engine that serves {needed}; this "
                              f"{inner.kind} engine, once started, serves {serves} (a command engine declares them "
                              "in its hello: docs/engine-protocol.md, section 5)")
        if kind in (VariantKind.BASELINE, VariantKind.CHUNKED_PREFILL, VariantKind.SPECULATIVE):
            for p in prompts:  # one prompt per call, whatever the arm's own `batch` says
                yield from inner.generate([p], sampling)
        elif kind == VariantKind.BATCH:
            for i in range(0, len(prompts), size or 1):
                yield from inner.generate_batch(prompts[i : i + (size or 1)], sampling)
        elif kind == VariantKind.CONCURRENCY:
            yield from inner.generate_concurrent(prompts, sampling, size or 1)
        elif kind == VariantKind.PREFIX_CACHE:
            for p in prompts:
                for _ in inner.generate([prefix_sharer(p, size)], sampling):
                    pass  # served for its cache entry; its tokens are not this variant's
                yield from inner.generate([p], sampling)
        else:
            yield from self._needles(prompts, sampling)

    def _needles(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        for needle, group in needle_batches(prompts, self.needle_max, self.seed):
            recs = [r for r in self.inner.generate_batch(group, sampling) if r.id == needle.id]
            if len(recs) != 1:
                raise EngineError(f"{self.kind}: {len(recs)} records for needle {needle.id!r} in a batch of "
                                  f"{len(group)}")
            yield recs[0]
