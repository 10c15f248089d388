"""Text-only servers (`text_only = true`): prompts sent as text, the reply tokenized in context.

A server that answers only text (vllm.cpp's, Ollama- and LM-Studio-style servers) returns no
token ids and no logprobs, and may ignore a prompt given as ids. Such an arm sends the prompt's
text, tokenizes prompt text + reply with the arm's own `tokenizer` and keeps the prompt's ids as
the prefix of that tokenization (when they are not, the record says so and is not compared).
What the server states about itself goes into the record's "text_only" object, for the judge to
check (judge/text_only.py): usage.prompt_tokens against the prompt's ids (a server that ignored
the prompt, or added or dropped a BOS), its /tokenize of the prompt text where it has one. The
engine itself checks what belongs to one reply: the finish reason against usage's count and
max_tokens, and, once per arm, the same prompt twice giving the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strict_gate.engines.base import PromptInput
from strict_gate.engines.openai.client import HTTPStatus, OpenAIClient
from strict_gate.errors import ConfigError, EngineError
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import Record, Sampling, TextReply, Timing

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def require_text(ps: PromptSet, arm: str) -> None:
    """A text-only arm sends text: a prompt given as token ids only cannot be sent (exit 2)."""
    ids_only = [p.id for p in ps.prompts if p.text is None]
    if ids_only:
        raise ConfigError(
            f"[{arm}] text_only = true sends each prompt as text, and {len(ids_only)} prompt(s) of the set are "
            f"token ids only (first: {ids_only[0]!r}); a text-only server cannot be given ids (vllm.cpp's "
            "completes the empty prompt instead). Use a prompt set with \"text\" for this arm",
            path=ps.path,
        )


def text_body(p: PromptInput, sampling: Sampling, stream: bool) -> dict:
    """The request's own fields for a text prompt: no logprobs, no token ids asked for."""
    if p.text is None:
        raise ConfigError(f"openai: text_only = true, and prompt {p.id!r} has no text (token ids only)")
    body: dict = {"prompt": p.text, "max_tokens": sampling.max_tokens, "temperature": 0.0, "n": 1,
                  "echo": False, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}  # the usage chunk: vLLM sends it only when asked
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    return body


@dataclass(frozen=True)
class InContext:
    """The reply placed as tokens: the prompt's ids (the arm's tokenizer) and the continuation."""

    prompt_ids: tuple[int, ...]
    continuation: tuple[int, ...]
    problem: str | None = None  # why the tokenization in context does not keep the prompt's ids


def in_context(tok: Tokenizer, prompt_text: str, reply: str) -> InContext:
    """Tokenize prompt text + reply in one go, as the model saw them, and split off the prompt's
    own ids. Where the tokenizer merges the prompt's last token with the reply ("\n" + "\n..."),
    the reply tokenized alone is taken when the prompt's ids and it decode to the very same text;
    else the reply cannot be placed, and that is said."""
    prompt_ids = tuple(tok.encode(prompt_text).ids)
    full = tuple(tok.encode(prompt_text + reply).ids)
    n = len(prompt_ids)
    if full[:n] == prompt_ids:
        return InContext(prompt_ids, full[n:])
    alone = tuple(tok.encode(reply, add_special_tokens=False).ids)
    if tok.decode([*prompt_ids, *alone], skip_special_tokens=False) == tok.decode(list(full), skip_special_tokens=False):
        return InContext(prompt_ids, alone)
    k = next((i for i, (a, b) in enumerate(zip(full, prompt_ids)) if a != b), min(n, len(full)))
    return InContext(prompt_ids, (), (
        f"tokenizing the prompt text + the reply in context does not reproduce the prompt's ids (they differ at "
        f"index {k}: the prompt alone {list(prompt_ids[k:k + 3])}, in context {list(full[k:k + 3])}); the reply "
        "cannot be placed after the prompt as tokens"))


def _count(usage: object, key: str) -> int | None:
    v = usage.get(key) if isinstance(usage, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def reply_problem(choice: dict, sampling: Sampling) -> str | None:
    """What makes a reply unusable on its own: no text, no usage, a finish reason that its own
    count of generated tokens contradicts."""
    if not isinstance(choice.get("text"), str):
        return f"the server's answer has no text: {str(choice)[:200]}"
    finish, usage = choice.get("finish_reason"), choice.get("usage")
    if finish not in ("stop", "length"):
        return f"server finished with finish_reason {finish!r}"
    prompt_n, n = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
    if prompt_n is None:
        return ("the server states no usage.prompt_tokens: whether it read the prompt (or ignored it, or "
                "added a BOS) cannot be checked on a text-only server")
    if n is not None and n > sampling.max_tokens:
        return f"the server generated {n} tokens (usage.completion_tokens) with max_tokens {sampling.max_tokens}"
    if finish == "length" and n is not None and n != sampling.max_tokens:
        return (f'the server finished "length" after {n} tokens (usage.completion_tokens), and "length" means '
                f"exactly max_tokens ({sampling.max_tokens}): it did not honour max_tokens")
    return None


def text_record(p: PromptInput, choice: dict, tok: Tokenizer, sampling: Sampling, timing: Timing,
                server_ids: Sequence[int] | None) -> Record:
    """A text-only reply as a record: the continuation's ids in context, the server's own figures."""
    assert p.text is not None  # text_body refused a prompt without text
    problem = reply_problem(choice, sampling)
    if problem is not None:
        return Record(id=p.id, prompt_token_ids=p.token_ids, error=problem, timing=timing)
    placed = in_context(tok, p.text, choice["text"])
    usage = choice["usage"]
    reply = TextReply(choice["text"], _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"),
                      None if server_ids is None else tuple(server_ids))
    rec = Record(id=p.id, prompt_token_ids=placed.prompt_ids, token_ids=placed.continuation,
                 finish_reason=choice["finish_reason"], timing=timing, text_only=reply)
    if placed.problem is None or reply.misread(placed.prompt_ids) is not None:  # a server that misread the prompt is
        return rec  # told by that (judge/text_only.py), before any placement of its reply
    return Record(id=p.id, prompt_token_ids=placed.prompt_ids, error=placed.problem, timing=timing)


def server_tokenize(client: OpenAIClient, model: str, p: PromptInput) -> list[int] | None:
    """The server's ids of the prompt text (vLLM's /tokenize); None when it has no such endpoint.
    Unreachable is the caller's (the server failed); any other failure is an EngineError."""
    try:
        out = client.call("POST", "/tokenize", {"model": model, "prompt": p.text}, retries=0, timeout=30.0)
    except HTTPStatus as e:
        if e.code in (404, 405, 501):
            return None
        raise EngineError(f"openai: /tokenize failed on prompt {p.id!r}: {e}") from None
    tokens = out.get("tokens") if isinstance(out, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise EngineError(f"openai: /tokenize answered without a token list: {str(out)[:200]}")
    return tokens


def repeat_problem(first: Record, again: Record) -> str | None:
    """The same prompt twice at temperature 0 must give the same text (determinism, checked once)."""
    if first.error is not None or again.error is not None or first.text_only is None or again.text_only is None:
        return None
    a, b = first.text_only.text, again.text_only.text
    if a == b and first.finish_reason == again.finish_reason:
        return None
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"the server answered the same prompt twice (greedy) with different text, from character {k}: "
            f"{a[k:k + 20]!r} then {b[k:k + 20]!r}; a non-deterministic server cannot be gated on one reply")
