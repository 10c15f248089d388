"""Teacher-forced scoring on an OpenAI-compatible server: one request over prompt + continuation
with vLLM's `prompt_logprobs`, and what its answer says when the server cannot score."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from strict_gate.engines.openai.client import HTTPStatus, PromptError, Unreachable, choice_of, parse_prompt_logprobs
from strict_gate.engines.openai.server import Server
from strict_gate.errors import EngineError
from strict_gate.runs.records import ScoredStep


class ScoringUnsupported(EngineError):
    """The server cannot score at all (no prompt_logprobs): the engine stops offering `score`."""


def score_reply(s: Server, body: dict, ids: Sequence[int], prompt_len: int, continuation_ids: Sequence[int], k: int, *,
                auth_hint: Callable[[HTTPStatus], str], died: Callable[[Server, str], Exception]) -> list[ScoredStep]:
    """The scoring request `body` (prompt + continuation `ids`) sent to `s`, its prompt_logprobs parsed."""

    def unsupported(why: str) -> EngineError:
        return ScoringUnsupported(
            f"openai: the server does not support teacher-forced scoring: {why} "
            "(it needs vLLM's prompt_logprobs on /v1/completions)"
        )

    try:
        choice = choice_of(s.client.call("POST", "/v1/completions", body))
    except HTTPStatus as e:
        if e.code in (401, 403):
            raise EngineError(auth_hint(e)) from None
        if 400 <= e.code < 500 and ("logprob" in e.message.lower() or e.code in (404, 405, 501)):
            raise unsupported(f"it rejected prompt_logprobs = {k} ({e})") from None
        if 400 <= e.code < 500:
            raise EngineError(f"openai: the scoring request was rejected ({e})") from None
        raise EngineError(f"openai: scoring failed: {e}") from None
    except Unreachable as e:
        raise EngineError(str(died(s, f"while scoring ({e})"))) from None
    except PromptError as e:
        raise EngineError(f"openai: scoring failed: {e}") from None
    plp = choice.get("prompt_logprobs")
    if not isinstance(plp, list):
        raise unsupported("its answer has no prompt_logprobs")
    if len(plp) != len(ids):
        raise EngineError(f"openai: prompt_logprobs has {len(plp)} entries for a prompt of {len(ids)} tokens")
    return parse_prompt_logprobs(plp, prompt_len, continuation_ids, k)
