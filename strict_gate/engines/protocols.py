"""The engine interface as small Protocols: the core every engine needs, and the capability groups
the gate's wings may ask for, each behind its flags (docs/engine-plugins.md).

`Engine` (base.py) satisfies all of them, with the optional groups' methods raising until a
subclass sets the flag and overrides them; a plugin author reads here the few methods a kind must
write and which flag opens each group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep

if TYPE_CHECKING:
    from strict_gate.engines.base import DumpReply, DumpRequest, Engine, PromptInput, Serving
    from strict_gate.engines.speculative import Acceptance, Speculation


@runtime_checkable
class EngineCore(Protocol):
    """What every engine does: describe itself, tokenize (before start), generate greedily, and a
    lifecycle that tolerates a second start() and a close() before any start()."""

    def info(self) -> EngineInfo: ...
    def tokenize(self, text: str) -> list[int]: ...
    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]: ...
    def start(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Scoring(Protocol):
    """Teacher-forced scoring (re-scoring divergences, drift): open when `can_score`."""

    @property
    def can_score(self) -> bool: ...
    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]: ...


@runtime_checkable
class Dumping(Protocol):
    """Activations for localisation (strict_gate/localize): `can_dump`, narrowed by the graft and
    decode-path flags."""

    @property
    def can_dump(self) -> bool: ...
    @property
    def can_graft(self) -> bool: ...
    @property
    def can_dump_decode(self) -> bool: ...
    @property
    def can_graft_ops(self) -> bool: ...
    def dump(self, request: DumpRequest) -> DumpReply: ...


@runtime_checkable
class Timed(Protocol):
    """What the speed arm (strict_gate/speed) asks: `measurable`, streaming when `streams`, a
    batch when `can_batch`, and the settings the matched-config check compares."""

    @property
    def measurable(self) -> bool: ...
    @property
    def streams(self) -> bool: ...
    @property
    def can_batch(self) -> bool: ...
    def speed_settings(self) -> dict: ...
    def tokenizer_file(self) -> Path | None: ...
    def stream_one(self, prompt: PromptInput, sampling: Sampling, on_token: Callable[[int], None]) -> Record: ...
    def generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> list[Record]: ...


@runtime_checkable
class Serves(Protocol):
    """The invariance variants (strict_gate/invariance): each method open when its Serving is in
    `servings`."""

    @property
    def servings(self) -> frozenset[Serving]: ...
    def generate_concurrent(self, prompts: Sequence[PromptInput], sampling: Sampling, in_flight: int
                            ) -> Iterator[Record]: ...
    def with_prefill_chunk(self, chunk: int) -> Engine: ...
    def with_prefix_cache(self) -> Engine: ...
    def with_speculative(self, spec: Speculation) -> Engine: ...
    def acceptance(self) -> Acceptance | None: ...


@runtime_checkable
class Hosted(Protocol):
    """Where the engine runs, so the gate knows what to scope and where output goes: in process
    (env applied to os.environ), or a process whose log belongs in the run directory."""

    @property
    def in_process(self) -> bool: ...
    @property
    def writes_log(self) -> bool: ...
    def set_log_path(self, path: str | Path) -> None: ...
    def scoped_env(self): ...


@runtime_checkable
class Replays(Protocol):
    """An engine that replays a stored run (`replays_run`) and refuses a gate it cannot match."""

    @property
    def replays_run(self) -> bool: ...
    def check_compatible(self, prompt_sha256: str, sampling: Sampling) -> None: ...


CAPABILITIES: tuple[type, ...] = (Scoring, Dumping, Timed, Serves, Hosted, Replays)
