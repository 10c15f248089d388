"""The engine protocol: generate greedily with top-k logprobs, tokenize, describe, score.

An engine is constructed from typed options (no model loaded) and tokenizes before it is
started. What the gate (strict_gate/gate/run.py) then does with it:

- one load per arm: the candidate is started for its arm (and timed on it under [speed]),
  then closed before the reference starts, so one engine is loaded at a time; the reference
  stays loaded for re-scoring and its speed rungs, and is closed after;
- start() is called again on a started engine (re-scoring and the speed arm start what they
  use) and must then do nothing;
- start() may follow close(): with `drift = true` and a live reference, the reference is
  closed and the candidate started a second time to score the reference's tokens;
- close() may come twice, or before any start(), and must be harmless; engines a caller
  hands to run_gate are never closed by the gate;
- each in-process call (tokenize, start, generate, score, the speed rungs) runs inside scoped_env(),
  so an arm's env switches hold only while that arm runs.

Engines are tiny adapters; the gate owns run files, timing, env scoping and progress.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from strict_gate.core.redact import register_env
from strict_gate.engines.speculative import Acceptance, Speculation
from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep


class Serving(StrEnum):
    """A way of serving prompts other than one at a time, whole-prompt prefill, cold: what the
    invariance variants (strict_gate/invariance) may ask of an engine. The value is the variant's
    name in an [invariance] table."""

    BATCH = "batch"  # generate_batch(): prompts submitted together
    CONCURRENCY = "concurrency"  # generate_concurrent(): up to N requests in flight, a sliding window
    CHUNKED_PREFILL = "chunked_prefill"  # with_prefill_chunk(n): an engine that prefills n tokens at a time
    PREFIX_CACHE = "prefix_cache"  # with_prefix_cache(): an engine that reuses a served prompt's prefix
    SPECULATIVE = "speculative"  # with_speculative(spec): an engine that drafts and verifies (engines/speculative.py)


@dataclass(frozen=True)
class PromptInput:
    """What an engine receives: the prompt's token ids (the same for both arms)."""

    id: str
    token_ids: tuple[int, ...]
    text: str | None = None


@dataclass(frozen=True)
class DumpRequest:
    """What the gate asks of an engine that can dump activations (docs/localize.md): run
    `token_ids` once, keep `positions` (indices into the ids) of each point, float32, and write
    them as one safetensors file into `directory`. `points` None: every point the engine gives.
    `graft`: a safetensors file of the reference's layer inputs (`embed`, `layers.{i}` at every
    position) fed into the engine's layers in place of its own; with `can_graft_ops`, op points
    too (`layers.{i}.mlp.act`, ...), each fed to the op that reads it."""

    token_ids: tuple[int, ...]
    points: tuple[str, ...] | None
    positions: tuple[int, ...]
    directory: Path
    graft: Path | None = None
    # decode: the first `decode_from` ids through prefill, then the rest one token at a time through
    # the decode path with its cache (the path a generated token takes); None: one prefill pass
    decode_from: int | None = None


@dataclass(frozen=True)
class DumpReply:
    """What an engine says it wrote; strict_gate.localize.capture audits it before use."""

    path: Path
    points: tuple[str, ...]


class Engine(ABC):
    """Base class for engines; subclasses set `kind`, `Options` and the capability flags."""

    kind: ClassVar[str]
    Options: ClassVar[type]
    can_score: bool = False  # supports teacher-forced score(); an instance may narrow it (command, openai)
    in_process: ClassVar[bool] = True  # runs in the gate's process (env is applied to os.environ)
    writes_log: ClassVar[bool] = False  # runs a process whose output belongs in the run directory
    log_libraries: ClassVar[tuple[str, ...]] = ()  # in-process libraries whose logging goes to engine.log
    replays_run: ClassVar[bool] = False  # replays a stored run: its records are known before any call
    speaks_http: ClassVar[bool] = False  # an HTTP server (OpenAI completions): no hello, no line protocol
    # The speed arm (strict_gate/speed): what it may ask of an engine, timed from outside.
    measurable: ClassVar[bool] = True  # a live engine (a stored run has no speed)
    # set on an engine served by a pool of Ray actors (cluster/engine.py): why what drives one
    # engine (speed, localisation) does not run on it; None for an engine of its own
    pooled: ClassVar[str | None] = None
    streams: ClassVar[bool] = False  # stream_one() reports each token as it arrives
    can_batch: ClassVar[bool] = False  # generate_batch() serves several sequences at once
    # Localisation (strict_gate/localize): activations at canonical points along the depth.
    can_dump: bool = False  # dump() writes activations
    can_graft: bool = False  # dump() honours DumpRequest.graft
    can_dump_decode: bool = False  # dump() honours DumpRequest.decode_from (the decode path)
    can_graft_ops: bool = False  # dump() honours op points in DumpRequest.graft, along either path
    capabilities_at_start: ClassVar[bool] = False  # can_* are narrowed when it starts (a command hello)
    # The invariance variants: the ways this kind may serve. An engine that learns its own at
    # start (a command engine's hello) narrows `servings` on the instance then.
    servings: frozenset[Serving] = frozenset()
    needs_text: bool = False  # takes each prompt as text, not ids (a text-only server: the speed ladder cuts text)

    def __init__(self, options, env: dict[str, str] | None = None, base_dir: str | Path = "."):
        self.options = options
        self.env = dict(env or {})
        register_env(self.env)  # from now on, secret-looking values are scrubbed from what is written
        self.base_dir = Path(base_dir)
        self.log_path: str | Path | None = None  # where a writes_log engine logs; None: a temp file
        # the config file and line of the table that built it (gate/config.py's ArmConfig.build):
        # a ConfigError it raises later (no tokenizer for text prompts) is named there
        self.configured_at: tuple[str | None, int | None] = (None, None)

    @classmethod
    def could_dump(cls, info: EngineInfo) -> bool:
        """Whether an engine of this class, as `info` describes it after a run, dumps activations:
        the class's flag (a kind that learns it at start reads what it said then)."""
        return cls.can_dump

    @classmethod
    def check_options(cls, options, *, where: str, line_of) -> None:
        """Checks of parsed options that need the engine's own knowledge, run when the config is
        read (before anything is built): a ConfigError at line_of(key) of file line_of.path."""

    @classmethod
    def pool_refusal(cls, options) -> str | None:
        """Why an arm of this kind with these options cannot be served by a pool of Ray actors
        (`[<role>.ray]`, strict_gate/cluster/), None when it can: each actor holds an engine of its own."""
        if cls.replays_run:
            return f"a {cls.kind!r} arm replays a stored run: it serves nothing, so there is nothing to pool"
        return None

    def check_prompt_set(self, ps, arm: str) -> None:
        """Refuse a prompt set this arm cannot be fed (ConfigError naming the file): a text-only
        server needs every prompt's text. Any set fits by default."""

    def set_log_path(self, path: str | Path) -> None:
        """Where the engine's process output goes (the runner passes <run dir>/engine.log)."""
        self.log_path = path

    def check_compatible(self, prompt_sha256: str, sampling: Sampling) -> None:
        """Refuse a gate this engine cannot honestly run (ConfigError). A live engine fits any;
        an engine that replays a stored run checks that run against the gate's conditions."""

    # -- lifecycle
    def start(self) -> None:
        """Load the model or launch the server; a no-op when started. Later phases reuse it; after
        close() it starts afresh (the drift pass restarts the candidate)."""

    def close(self) -> None:
        """Release the model or stop the server. Safe to call twice, or before start()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the protocol
    @abstractmethod
    def info(self) -> EngineInfo:
        """Describe the engine for the run manifest: kind, model, options, env, versions."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids for a text prompt, special tokens included as the engine adds them.

        Must work before start(): the gate tokenizes once, then feeds the same ids to both arms.
        """

    @abstractmethod
    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        """Greedy generation, one record per prompt, yielded as each finishes.

        Raise EngineError (with the prompt id in the message) when the engine itself fails;
        yield a Record with `error` set for a single prompt that failed on its own.
        """

    def prompt_token_ids(self, prompt) -> tuple[int, ...]:
        """The ids this engine feeds for a prompt-set entry (text is tokenized, ids pass as is)."""
        if prompt.token_ids is not None:
            return tuple(prompt.token_ids)
        return tuple(self.tokenize(prompt.text))

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        """Teacher-forced: for each continuation token, its logprob and the top-k given the prefix."""
        raise NotImplementedError(f"engine {self.kind!r} cannot score")

    def dump(self, request: DumpRequest) -> DumpReply:
        """Activations at canonical points for one sequence (only if `can_dump`)."""
        raise NotImplementedError(f"engine {self.kind!r} cannot dump activations")

    def tokenizer_file(self) -> Path | None:
        """The tokenizer.json this engine's ids come from, when one is on disk (the speed ladder
        draws its prompts from that vocabulary); None: none is known."""
        return None

    # -- the speed arm
    def speed_settings(self) -> dict:
        """What the matched-config check compares (dtype, eager, kv_cache, prefix_cache,
        max_context); a key that is absent or None is unknown, never assumed."""
        return {}

    def stream_one(self, prompt: PromptInput, sampling: Sampling, on_token: Callable[[int], None]) -> Record:
        """Generate one prompt, calling on_token(n) as n new tokens arrive (only if `streams`)."""
        raise NotImplementedError(f"engine {self.kind!r} does not stream")

    def generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> list[Record]:
        """Every prompt in flight at once, one record each (only if `can_batch`)."""
        raise NotImplementedError(f"engine {self.kind!r} cannot serve a batch")

    # -- the invariance variants (strict_gate/invariance)
    def generate_concurrent(self, prompts: Sequence[PromptInput], sampling: Sampling, in_flight: int
                            ) -> Iterator[Record]:
        """Keep up to `in_flight` requests outstanding, one record per prompt as each finishes
        (only with Serving.CONCURRENCY)."""
        raise NotImplementedError(f"engine {self.kind!r} cannot keep requests in flight")

    def with_prefill_chunk(self, chunk: int) -> Engine:
        """An engine (not started) like this one that prefills `chunk` prompt tokens per step; 0:
        the whole prompt in one step (only with Serving.CHUNKED_PREFILL)."""
        raise NotImplementedError(f"engine {self.kind!r} cannot chunk its prefill")

    def with_prefix_cache(self) -> Engine:
        """This engine when it reuses cached prefixes, else one like it that does (only with
        Serving.PREFIX_CACHE)."""
        raise NotImplementedError(f"engine {self.kind!r} has no prefix cache")

    def with_speculative(self, spec: Speculation) -> Engine:
        """An engine (not started) like this one that decodes speculatively by `spec` (only with
        Serving.SPECULATIVE)."""
        raise NotImplementedError(f"engine {self.kind!r} cannot decode speculatively")

    def acceptance(self) -> Acceptance | None:
        """Speculative acceptance counts since start, cumulative (the variant subtracts two
        readings); None: this engine gives none."""
        return None

    @contextmanager
    def scoped_env(self):
        """Apply this arm's env switches for an in-process call and restore them after."""
        if not self.in_process or not self.env:
            yield
            return
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update({k: str(v) for k, v in self.env.items()})
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def greedy_finish_reason(token_ids: Sequence[int], eos_ids: set[int]) -> str:
    """'stop' when the sequence ends on an EOS, else 'length' (as vLLM reports it)."""
    if token_ids and token_ids[-1] in eos_ids:
        return "stop"
    return "length"


def over_context(p: PromptInput, sampling: Sampling, max_context: int | None) -> Record | None:
    """An error record for a prompt whose tokens plus max_tokens exceed the model's known context
    (None: it fits, or the context is unknown). Refused before it reaches the engine: fed one, an
    engine may compute for hours past its positions, or answer from a truncated prompt."""
    if max_context is None or len(p.token_ids) + sampling.max_tokens <= max_context:
        return None
    return Record(id=p.id, prompt_token_ids=p.token_ids, error=(
        f"not run: {len(p.token_ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed the model's "
        f"context of {max_context} tokens"))
