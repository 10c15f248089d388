"""HTTP half of the openai engine: requests to one OpenAI-compatible server, and parsing.

Token ids in, token ids out: a prompt goes to `/v1/completions` as a list of ids and the
generated tokens come back as ids (`return_tokens_as_token_ids`, vLLM's `"token_id:123"`
form, and `return_token_ids`). A server that can only answer with text is refused:
comparing re-tokenized text would hide exactly the differences this tool exists to find.
Teacher-forced scoring reads `prompt_logprobs` (vLLM): entry i scores token i given 0..i-1.

Only the standard library is used (urllib), so the core stays light. The API key is read
at each use from the environment variable named by `api_key_env`; it is never stored.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.client import HTTPException
from typing import SupportsFloat

from strict_gate.core.redact import register
from strict_gate.engines.base import PromptInput
from strict_gate.engines.openai.transport import Deadline, OpenStream, open_request
from strict_gate.errors import EngineError
from strict_gate.runs.records import Record, ScoredStep, Timing, sort_topk

TOKEN_ID_PREFIX = "token_id:"


class HTTPStatus(Exception):
    """A non-2xx answer that is not retried (4xx) or that outlived its retries (5xx)."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        super().__init__(f"HTTP {code}: {message}")


class Unreachable(Exception):
    """No answer at all: connection refused/reset, server gone, or a timeout."""


class ServerExited(Unreachable):
    """The launched server process is gone (its exit code is known)."""

    def __init__(self, code: int):
        self.code = code
        super().__init__(f"the server process exited with code {code}")


class PromptError(Exception):
    """A failure that belongs to one prompt (recorded on its Record, the run goes on)."""


def server_message(body: bytes) -> str:
    """The error text of an OpenAI-style error body, else the body itself (shortened)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
        if obj.get("message"):
            return str(obj["message"])[:500]
    return text[:500]


def token_id(s: object) -> int | None:
    """123 from "token_id:123"; None for a token that came back as text."""
    if isinstance(s, str) and s.startswith(TOKEN_ID_PREFIX):
        try:
            return int(s[len(TOKEN_ID_PREFIX):])
        except ValueError:
            return None
    return None


def logprob_value(v: SupportsFloat | str) -> float:
    lp = float(v)  # json reads -Infinity as -inf; vLLM clamps to -9999.0
    if math.isnan(lp):
        raise ValueError("NaN logprob")
    return lp


class OpenAIClient:
    """Requests to one server, with bounded retries. `alive` (launch mode) raises ServerExited
    when the server process is gone, so a retry loop does not wait on a dead server."""

    def __init__(self, base_url: str, api_key_env: str | None, request_timeout_s: float, retries: int,
                 alive: Callable[[], None] | None = None):
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.request_timeout_s = request_timeout_s
        self.retries = retries
        self.alive = alive or (lambda: None)

    @property
    def api_key(self) -> str | None:
        """Read at each use from the variable named by api_key_env; never stored, and registered
        so that whatever the gate writes (an error echoing it) is scrubbed."""
        key = (os.environ.get(self.api_key_env) or None) if self.api_key_env else None
        register(key)
        return key

    def _request(self, method: str, path: str, body: dict | None) -> urllib.request.Request:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        data = None if body is None else json.dumps(body).encode("utf-8")
        return urllib.request.Request(url, data=data, method=method, headers=headers)

    def call(self, method: str, path: str, body: dict | None = None, *, timeout: float | None = None,
             retries: int | None = None, stream: bool = False, parse: bool = True):
        """One request with bounded retries (connection errors and 5xx only, with backoff).

        `timeout` (default request_timeout_s) is a deadline on each attempt as a whole
        (transport.py). Returns the parsed JSON (the raw body when parse=False, an OpenStream
        when stream=True). Raises HTTPStatus for a 4xx (or a 5xx after the retries),
        Unreachable when no complete answer came, Redirected for a redirect.
        """
        timeout = self.request_timeout_s if timeout is None else timeout
        retries = self.retries if retries is None else retries
        last: Exception | None = None
        for attempt in range(retries + 1):
            if attempt:
                self.alive()
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            deadline = Deadline(timeout)
            handed_over = False  # an OpenStream's deadline runs until the stream is closed
            try:
                resp = open_request(self._request(method, path, body), deadline)
                if stream:
                    handed_over = True
                    return OpenStream(resp, deadline)
                with resp:
                    raw = resp.read()
                if deadline.expired:
                    raise Unreachable(deadline.message)
                if not parse:
                    return raw
                try:
                    return json.loads(raw)
                except ValueError:
                    raise HTTPStatus(resp.status, "the answer is not JSON: " + raw[:200].decode(errors="replace")) from None
            except urllib.error.HTTPError as e:
                msg = server_message(e.read() if e.fp else b"")
                e.close()
                if deadline.expired:
                    raise Unreachable(deadline.message) from None
                if 500 <= e.code < 600:
                    last = HTTPStatus(e.code, msg)
                    continue
                raise HTTPStatus(e.code, msg) from None
            except (urllib.error.URLError, ConnectionError, HTTPException, OSError, ValueError) as e:
                if deadline.expired or isinstance(getattr(e, "reason", e), TimeoutError):
                    # the server hangs or trickles: retrying would double the wait
                    raise Unreachable(deadline.message) from None
                reason = getattr(e, "reason", e)
                last = Unreachable(f"{type(reason).__name__}: {reason}")
                continue
            finally:
                if not handed_over:
                    deadline.cancel()
        if isinstance(last, HTTPStatus):
            raise last
        raise Unreachable(f"{last} (after {retries + 1} attempts)")

    def complete(self, body: dict, on_token: Callable[[int], None] | None = None) -> tuple[dict, float | None]:
        """One completion: (its choice, time to first token when streamed, else None).
        Streamed, on_token(n) is called as each chunk brings n new tokens (the speed arm)."""
        t0 = time.perf_counter()
        if body.get("stream"):
            return self._stream(body, t0, on_token)
        resp = self.call("POST", "/v1/completions", body)
        choice = choice_of(resp)
        return ({**choice, "usage": resp["usage"]} if isinstance(resp.get("usage"), dict) else choice), None

    def _stream(self, body: dict, t0: float, on_token: Callable[[int], None] | None = None
                ) -> tuple[dict, float | None]:
        """Stream one completion (SSE) and fold its chunks into one choice; TTFT = first token."""
        stream = self.call("POST", "/v1/completions", body, stream=True)
        text_only = "logprobs" not in body  # a text-only request: text deltas are what arrives
        merged: dict = {"logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": []}, "token_ids": None,
                        "text": ""}
        ttft = None
        saw_logprobs = False
        try:
            with stream:
                for raw in stream:
                    if stream.deadline.expired:  # the line was cut short by it
                        break
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        raise PromptError(f"unreadable stream chunk: {data[:200]}") from None
                    if isinstance(obj, dict) and obj.get("error"):
                        raise PromptError(f"server error mid-stream: {server_message(data.encode())}")
                    if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                        merged["usage"] = obj["usage"]  # the last chunk (include_usage), or on each
                    for ch in obj.get("choices") or []:
                        lp = ch.get("logprobs")
                        n_new = 0
                        if lp:
                            saw_logprobs = True
                            for key in ("tokens", "token_logprobs", "top_logprobs"):
                                merged["logprobs"][key].extend(lp.get(key) or [])
                            n_new = len(lp.get("tokens") or [])
                        if ch.get("token_ids") is not None:
                            merged["token_ids"] = (merged["token_ids"] or []) + list(ch["token_ids"])
                            n_new = n_new or len(ch["token_ids"])
                        if ch.get("prompt_token_ids") is not None:
                            merged["prompt_token_ids"] = ch["prompt_token_ids"]
                        if ch.get("finish_reason") is not None:
                            merged["finish_reason"] = ch["finish_reason"]
                        if isinstance(ch.get("text"), str) and ch["text"]:
                            merged["text"] += ch["text"]
                            if text_only:  # the first text delta is the first token seen
                                ttft = time.perf_counter() - t0 if ttft is None else ttft
                                if on_token is not None:
                                    on_token(1)  # a delta (one token or more): the count comes from the whole reply
                        if n_new and ttft is None:
                            ttft = time.perf_counter() - t0
                        if n_new and on_token is not None:
                            on_token(n_new)
        except (TimeoutError, ConnectionError, HTTPException, OSError, ValueError) as e:
            self.alive()
            if stream.deadline.expired:
                raise Unreachable(stream.deadline.message) from None
            raise Unreachable(f"the stream broke: {type(e).__name__}: {e}") from None
        if stream.deadline.expired:
            raise Unreachable(stream.deadline.message)
        if "finish_reason" not in merged:
            self.alive()
            raise Unreachable("the stream ended without a finish_reason")
        if not saw_logprobs:
            merged["logprobs"] = None
        return merged, ttft


def choice_of(resp: object) -> dict:
    """The answer's first choice, with the answer's `usage` beside it (what the server says it read)."""
    if not isinstance(resp, dict) or not resp.get("choices") or not isinstance(resp["choices"][0], dict):
        raise PromptError(f"the server's answer has no choices: {str(resp)[:300]}")
    choice = resp["choices"][0]
    return {**choice, "usage": resp["usage"]} if isinstance(resp.get("usage"), dict) else choice


def check_prompt_read(p: PromptInput, choice: dict) -> None:
    """A server that ignores a token-id prompt (completes another one, often the empty prompt)
    says so in `usage.prompt_tokens`, where it gives usage: refuse its answer, naming that."""
    read = (choice.get("usage") or {}).get("prompt_tokens")
    if isinstance(read, int) and not isinstance(read, bool) and read != len(p.token_ids):
        raise EngineError(
            f"openai: prompt {p.id!r}: {len(p.token_ids)} token ids were sent as the prompt, and the server "
            f"says it read {read} (usage.prompt_tokens): it does not take a prompt as token ids, so it "
            "completed another prompt. The openai arm needs a server that takes token-id prompts (docs/configuring-engines.md, "
            "\"What the openai arm needs from a server\")."
        )


def parse_completion(p: PromptInput, choice: dict, timing: Timing) -> Record:
    """A completion's choice as a Record: generated ids, top-k by id, finish reason."""
    check_prompt_read(p, choice)
    lp = choice.get("logprobs") or {}
    tokens = lp.get("tokens") or []
    parsed = [token_id(t) for t in tokens]
    as_ids = bool(tokens) and all(t is not None for t in parsed)
    server_ids = choice.get("token_ids")
    if server_ids is not None and not (isinstance(server_ids, list) and all(isinstance(t, int) for t in server_ids)):
        raise EngineError(f"openai: prompt {p.id!r}: token_ids in the answer is not a list of integers")
    if as_ids:
        gen = [t for t in parsed if t is not None]  # as_ids: every one is an id
        if server_ids is not None and list(server_ids) != gen:
            raise EngineError(
                f"openai: prompt {p.id!r}: the server's token_ids {server_ids} disagree with its "
                f"logprobs tokens {gen}"
            )
    elif server_ids is not None:
        gen = list(server_ids)
    elif not tokens and lp and choice.get("finish_reason") is not None and not choice.get("text"):
        gen = []  # nothing generated (e.g. max_tokens 0)
    else:
        raise EngineError(
            "openai: the server cannot return token ids: its tokens came back as text "
            f"(e.g. {tokens[:3]!r}) and the answer has no token_ids. Comparing re-tokenized text is "
            "refused: it hides the differences this gate looks for. Use a server that supports "
            "return_tokens_as_token_ids / return_token_ids (vLLM does)."
        )
    top = None
    if as_ids or not tokens:
        top = _top_logprobs(p, gen, lp) if lp else None
    # else: ids are known (token_ids) but the top-k came back as text: alternatives cannot be
    # identified without re-tokenizing, so no logprobs are recorded rather than guessed ones.
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        return Record(
            id=p.id, prompt_token_ids=p.token_ids, token_ids=tuple(gen),
            error=f"server finished with finish_reason {finish!r}", timing=timing,
        )
    reported = choice.get("prompt_token_ids")
    if isinstance(reported, list) and all(isinstance(t, int) for t in reported):
        prompt_ids = tuple(reported)
    else:
        prompt_ids = tuple(p.token_ids)
    return Record(id=p.id, prompt_token_ids=prompt_ids, token_ids=tuple(gen), finish_reason=finish,
                  top_logprobs=top, timing=timing)


def _top_logprobs(p: PromptInput, gen: list[int], lp: dict):
    tops = lp.get("top_logprobs")
    sampled = lp.get("token_logprobs") or []
    if tops is None or len(tops) != len(gen):
        raise EngineError(
            f"openai: prompt {p.id!r}: the server returned {0 if tops is None else len(tops)} top_logprobs "
            f"steps for {len(gen)} tokens"
        )
    steps = []
    for i, (tok, step) in enumerate(zip(gen, tops)):
        pairs: dict[int, float] = {}
        for key, value in (step or {}).items():
            tid = token_id(key)
            if tid is None:
                raise EngineError(
                    f"openai: prompt {p.id!r} step {i}: a top-k token came back as text ({key!r}), not as "
                    "a token id; comparing re-tokenized text is refused"
                )
            pairs[tid] = logprob_value(value)
        if tok not in pairs and i < len(sampled) and sampled[i] is not None:
            pairs[tok] = logprob_value(sampled[i])
        steps.append(sort_topk(pairs.items()))
    return tuple(steps)


def parse_prompt_logprobs(plp: list, n_prompt: int, continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
    """Steps for the continuation from a prompt_logprobs list over prompt + continuation."""
    out = []
    for i, tok in enumerate(continuation_ids):
        entry = plp[n_prompt + i]
        if not isinstance(entry, dict):
            raise EngineError(f"openai: prompt_logprobs[{n_prompt + i}] is {entry!r}, expected a dict")
        pairs: list[tuple[int, float]] = []
        logprob = None
        for key, val in entry.items():
            try:
                tid: int | None = int(key)
            except ValueError:
                tid = token_id(key)
            if tid is None:
                raise EngineError(f"openai: prompt_logprobs[{n_prompt + i}] has a non-id key {key!r}")
            lpv = logprob_value(val["logprob"] if isinstance(val, dict) else val)
            rank = val.get("rank") if isinstance(val, dict) else None
            if tid == tok:
                logprob = lpv
            # The answer holds the top-k plus the scored token itself; keep the top-k only.
            if tid != tok or rank is None or rank <= k:
                pairs.append((tid, lpv))
        top = sort_topk(pairs)
        if len(top) > k:  # rank missing: drop the scored token if it is outside the top-k
            top = top[:k]
        out.append(ScoredStep(token_id=int(tok), logprob=logprob, top=top))
    return out
