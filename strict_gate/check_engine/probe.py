"""What check-engine sends, and what it keeps of the answers.

Every request goes through the engine's own class, so a binary is driven by CommandEngine: the
gate's framing, reply checks and failure handling, not a second implementation. Every record is
put through the run audit (strict_gate/runs/audit.py) on arrival; a check then compares what it
needs. A failed request raises Failed (or EngineError, the engine being dead: the next request
starts a fresh one).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from strict_gate.check_engine.numerics import Tolerance
from strict_gate.core.model_files import find_tokenizer_json
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.engines.command.engine import CommandEngine
from strict_gate.engines.eos import eos_token_ids
from strict_gate.errors import ConfigError, MissingExtraError
from strict_gate.runs.audit import audit_record, vocab_size
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import Record, Sampling, ScoredStep

MAX_TOKENS = 16
TOP_K = 5
SAMPLING = Sampling(MAX_TOKENS, TOP_K)
PROMPT_COUNT = 4  # "a few": the checks send about 25 requests over these
BUNDLED_TOKENIZER = "bundled:tiny-llama"
# From prompts/battery-128.jsonl; code-006 ends on the bundled model's EOS at once (float32).
PROMPT_TEXTS = {
    "prose-001": "Once upon a time, in a small village at the edge of a forest, there lived an old clockmaker who",
    "list-001": "Days of the week: Monday, Tuesday, Wednesday,",
    "arith-006": "If a train travels 120 km in 1.5 hours, its average speed is",
    "code-006": "try:\n    value = int(text)\nexcept ValueError as exc:\n    raise SystemExit(f\"not a number: {text!r}\") from exc\n",
}


class Failed(Exception):
    """What a check saw that breaks the protocol page; the message is the checklist's detail."""


class Skipped(Exception):
    """A check that cannot run because what it needs failed earlier."""


@dataclass(frozen=True)
class Generated:
    """One generate request check-engine sent, and its audited record."""

    label: str
    sampling: Sampling
    eos: tuple[int, ...] | None  # the ids the engine was to stop on, where known
    record: Record
    wall_s: float  # on the gate's clock, around the whole request


def _bundled_tokenize(texts: Sequence[str]) -> list[tuple[int, ...]]:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingExtraError("tokenizers", "hf") from None
    path = find_tokenizer_json(BUNDLED_TOKENIZER, Path("."))
    if path is None:
        raise ConfigError(f"the bundled tokenizer ({BUNDLED_TOKENIZER}) is not in this install; give --prompts")
    tok = Tokenizer.from_file(str(path))
    return [tuple(tok.encode(t, add_special_tokens=True).ids) for t in texts]


def prompt_inputs(engine: Engine, prompts: PromptSet | None) -> tuple[list[PromptInput], str]:
    """The prompts' ids and where they came from: the engine's own tokenizer where it has one,
    else the bundled model's. A prompt set (--prompts) gives its first few prompts."""
    items: list[tuple[str, str, tuple[int, ...] | None]] = \
        [(p.id, p.text or "", p.token_ids) for p in prompts.prompts[:PROMPT_COUNT]] if prompts else \
        [(pid, text, None) for pid, text in PROMPT_TEXTS.items()]
    texts = [text for _, text, ids in items if ids is None]
    where = f"{len(items)} prompts of {prompts.name}" if prompts else f"{len(items)} built-in texts"
    ids_of: dict[str, tuple[int, ...]] = {}
    if texts:
        try:
            encoded = [tuple(engine.tokenize(t)) for t in texts]
            where += f", tokenized by the {engine.kind} engine's tokenizer"
        except ConfigError:  # a command engine without `tokenizer`
            encoded = _bundled_tokenize(texts)
            where += f", tokenized by the bundled tokenizer ({BUNDLED_TOKENIZER}): the engine has none"
        ids_of = dict(zip(texts, encoded))
    inputs = [PromptInput(pid, ids if ids is not None else ids_of[text], text) for pid, text, ids in items]
    return inputs, where


@dataclass
class Probe:
    """The engine under check, the prompts, and every generate request sent so far."""

    engine: Engine
    prompts: list[PromptInput]
    tolerance: Tolerance
    generated: list[Generated] = field(default_factory=list)
    runs: dict[str, Record] = field(default_factory=dict)  # the greedy check's records, by prompt id
    score_works: bool = False
    _vocab: int | None = None

    @property
    def command(self) -> CommandEngine | None:
        """The engine as a line-protocol process, when it is one (raw requests, EOF, the hello)."""
        return self.engine if isinstance(self.engine, CommandEngine) else None

    def start(self) -> None:
        self.engine.start()  # a no-op while running; a fresh process after one was killed
        if self._vocab is None:
            self._vocab = vocab_size(self.engine.info())

    def need_runs(self) -> dict[str, Record]:
        if not self.runs:
            raise Skipped("no greedy record to compare with (see greedy)")
        return self.runs

    def prompt(self, pid: str) -> PromptInput:
        return next(p for p in self.prompts if p.id == pid)

    def model_eos(self) -> tuple[int, ...] | None:
        """The ids a generate request stops on: those sent to a command engine, else what vLLM
        stops on for the engine's model files (strict_gate/engines/eos.py), where known."""
        if self.command is not None:
            return self.command.eos_token_ids
        ref = self.engine.info().tokenizer
        path = find_tokenizer_json(ref, Path.cwd()) if ref else None
        return eos_token_ids(path) if path is not None else None

    @contextmanager
    def _eos(self, eos: tuple[int, ...] | None) -> Iterator[None]:
        """Requests of this block carry `eos` as their eos_token_ids (command engines only)."""
        if eos is None:
            yield
            return
        command = self.command
        assert command is not None, "only a command engine is sent eos ids of the check's choosing"
        saved, command.eos_token_ids = command.eos_token_ids, eos
        try:
            yield
        finally:
            command.eos_token_ids = saved

    def generate(self, prompt: PromptInput, sampling: Sampling = SAMPLING, *,
                 eos: tuple[int, ...] | None = None) -> Record:
        label = describe(prompt, sampling, eos)
        self.start()
        with self._eos(eos):
            t0 = time.perf_counter()
            records = list(self.engine.generate([prompt], sampling))
            wall = time.perf_counter() - t0
        if len(records) != 1:
            raise Failed(f"{label}: {len(records)} records for one prompt")
        rec = records[0]
        if rec.error is not None:
            raise Failed(f"{label}: the engine answered an error: {rec.error!r}")
        problem = audit_record(rec, sampling.max_tokens, self._vocab)
        if problem is not None:
            raise Failed(f"{label}: {problem}")
        self.generated.append(Generated(label, sampling, eos if eos is not None else self.model_eos(), rec, wall))
        return rec

    def score(self, prompt: PromptInput, continuation: Sequence[int], k: int = TOP_K) -> list[ScoredStep]:
        self.start()
        return self.engine.score(prompt.token_ids, continuation, k)


def describe(prompt: PromptInput, sampling: Sampling, eos: tuple[int, ...] | None = None) -> str:
    extra = ", ignore_eos" if sampling.ignore_eos else ""
    if eos is not None:
        extra += f", eos_token_ids {list(eos)}"
    return f"prompt {prompt.id!r} (max_tokens {sampling.max_tokens}, top_logprobs {sampling.top_logprobs}{extra})"


def chosen_logprobs(rec: Record) -> list[float | None]:
    """The logprob each step reports for its chosen token (None where it lists none)."""
    return [rec.logprob_at(i, t) for i, t in enumerate(rec.token_ids)]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a length counts), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
