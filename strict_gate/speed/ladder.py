"""The ladder: which rungs run, and the identical inputs both arms are fed on each.

Ladder prompts are synthesised token ids, drawn by a seeded generator from the model's
vocabulary minus its special and added tokens (so no EOS or BOS in the middle of a prompt).
Each request of each repetition gets its own prompt, so no request reads a KV prefix cached
by an earlier one; the seeds depend only on the rung, the repetition and the request, so
both arms get the very same ids. The gate rung's full requests repeat the gate's own prompts,
which the gate has already run: an engine with a prefix cache answers their prefill from it
(the matched check compares prefix caching for that reason, and the report says so). Its
max_tokens=1 requests get a fresh prompt of each gate prompt's length, so that the two
requests of the two-request method never share a cached prompt.
Rungs longer than the models' context are dropped, saying so.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError
from strict_gate.speed.config import SpeedConfig
from strict_gate.speed.model import Rung
from strict_gate.speed.text_prompts import TextSpace, text_space


class Request(StrEnum):
    """The two requests of every unit: the max_tokens=1 one (two-request TTFT), the full one."""

    TTFT = "ttft"
    FULL = "full"


NO_VOCABULARY = ("ladder prompts need the model's vocabulary: give either arm a `tokenizer` "
                 "(a tokenizer.json or a model directory holding one)")


@dataclass(frozen=True)
class TokenSpace:
    """Ids a synthesised prompt may use."""

    vocab_size: int
    avoid: frozenset[int]

    def draw(self, seed: str, n: int) -> tuple[int, ...]:
        rng = random.Random(seed)
        out: list[int] = []
        while len(out) < n:
            t = rng.randrange(self.vocab_size)
            if t not in self.avoid:
                out.append(t)
        return tuple(out)


def token_space(engines: list[Engine]) -> TokenSpace | None:
    """The vocabulary and special ids from the tokenizer.json of the first arm that has one, else None."""
    for engine in engines:
        tok = engine.tokenizer_file()
        space = _read_space(tok) if tok is not None else None
        if space is not None:
            return space
    return None


def _read_space(tok: Path) -> TokenSpace | None:
    try:
        data = json.loads(tok.read_text(encoding="utf-8"))
        vocab = data.get("model", {}).get("vocab")
        size = len(vocab) if isinstance(vocab, (dict, list)) else 0
        avoid = {int(t["id"]) for t in data.get("added_tokens") or [] if isinstance(t.get("id"), int)}
        config = tok.parent / "config.json"
        if config.is_file():
            cfg = json.loads(config.read_text(encoding="utf-8"))
            size = cfg.get("vocab_size") or size
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                ids = cfg.get(key)
                avoid.update(i for i in (ids if isinstance(ids, list) else [ids]) if isinstance(i, int))
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    if not isinstance(size, int) or size <= len(avoid):
        return None
    return TokenSpace(size, frozenset(avoid))


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[Rung, ...]
    notes: tuple[str, ...]
    space: TokenSpace | None
    gate_inputs: tuple[PromptInput, ...]
    seed: int
    top_logprobs: int  # asked of both arms on every request: the tokens are checked, not only timed
    context: int | None  # the smallest max context the arms stated before they started
    text: TextSpace | None = None  # a text-only arm: prompts cut from real text (text_prompts.py)

    def inputs(self, rung: Rung, rep: int, request: Request) -> list[list[PromptInput]]:
        """Units of one repetition: the gate rung is one unit per prompt (one after another),
        a ladder rung one unit of `concurrency` sequences in flight together. The gate rung's
        TTFT units are empty when no vocabulary is known (no fresh prompt can be drawn)."""
        if rung.prompt_tokens is None:
            if request is Request.FULL:
                return [[p] for p in self.gate_inputs]
            if self.space is None and self.text is None:
                return [[] for _ in self.gate_inputs]
            return [[self._fresh(rung, rep, request, i, len(p.token_ids))] for i, p in enumerate(self.gate_inputs)]
        if self.space is None and self.text is None:
            raise LookupError(NO_VOCABULARY)
        return [[self._fresh(rung, rep, request, i, rung.prompt_tokens) for i in range(rung.concurrency)]]

    def _fresh(self, rung: Rung, rep: int, request: Request, i: int, n: int) -> PromptInput:
        pid, seed = f"{rung.name}#{rep}-{request}-{i}", f"{self.seed}:{rung.name}:{rep}:{request}:{i}"
        if self.text is not None:  # a text-only arm: both arms get real text of n tokens (and its ids)
            ids, text = self.text.draw(seed, n)
            return PromptInput(pid, ids, text)
        assert self.space is not None
        return PromptInput(pid, self.space.draw(seed, n))


def build_ladder(cfg: SpeedConfig, gate_max_tokens: int, top_logprobs: int, gate_inputs,
                 engines: list[Engine]) -> Ladder:
    """The rungs both arms run, in order; dropped rungs and skipped concurrency levels as notes."""
    notes: list[str] = []
    limits = [s["max_context"] for s in (e.speed_settings() for e in engines)
              if isinstance(s.get("max_context"), int)]
    context = min(limits) if limits else None
    single = [e.kind for e in engines if not e.can_batch]
    for c in cfg.concurrency:
        if c > 1 and single:
            notes.append(f"concurrency {c} skipped: the {' and '.join(sorted(set(single)))} engine kind "
                         "serves one sequence at a time")
    rungs: list[Rung] = []
    for spec in cfg.rungs:
        if spec.prompt_tokens is None or spec.max_tokens is None:  # the gate rung
            rungs.append(Rung("gate", None, gate_max_tokens, 1, len(gate_inputs)))
            continue
        need = spec.prompt_tokens + spec.max_tokens
        if context is not None and need > context:
            notes.append(f"rung {spec.name} dropped: {need} tokens exceed the models' max context ({context})")
            continue
        for c in cfg.concurrency:
            if c > 1 and single:
                continue
            name = spec.name if c == 1 else f"{spec.name}@{c}"
            rungs.append(Rung(name, spec.prompt_tokens, spec.max_tokens, c, c))
    space = token_space(engines) if rungs else None
    text = _text(engines, gate_inputs) if rungs else None
    return Ladder(tuple(rungs), tuple(notes), space, tuple(gate_inputs), cfg.seed, max(1, top_logprobs), context,
                  text)


def _text(engines: list[Engine], gate_inputs) -> TextSpace | None:
    """With a text-only arm: the gate's prompt texts as the pool, read by that arm's tokenizer."""
    needs = [e for e in engines if e.needs_text]
    if not needs:
        return None
    space = text_space(needs[0].tokenizer_file(), [p.text for p in gate_inputs if p.text])
    if space is None:
        raise ConfigError("a text-only arm is timed on text prompts cut from the gate's prompt texts: give the "
                          "prompt set as text and the arm a `tokenizer`")
    return space
