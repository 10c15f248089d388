"""Several generate requests in flight at once, and the hello fields that allow it (additive to
strict-gate/engine@1; docs/engine-protocol.md, section 5, "Requests in flight").

- `"max_in_flight": N` in the hello (an integer >= 1, default 1): the gate may keep up to N
  generate requests outstanding. Replies carry the request's id and may come in any order.
- `"prefill_chunk"` in the hello's capabilities: the engine honours a generate request's
  `"prefill_chunk": C` field (prefill C prompt tokens per step; 0: the whole prompt at once).
- `"prefix_cache": true` in the hello: the engine reuses a served prompt's prefix.
- `"speculative"` in the hello's capabilities: the engine honours a generate request's
  `"speculative": {"method": "ngram", "num_speculative_tokens": K}` (engines/speculative.py).

Every rule the gate holds the engine to while requests overlap is here: a reply for an id that
is not in flight, a second reply for an id already answered (more replies than requests), a
request the engine does not read while fewer than its declared max_in_flight are outstanding,
and no reply within timeout_s. Each is an engine failure that names the rule.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence

from strict_gate.engines.base import Serving
from strict_gate.engines.speculative import SPECULATIVE
from strict_gate.errors import EngineError

PREFILL_CHUNK = "prefill_chunk"


def hello_servings(hello: dict) -> tuple[int, frozenset[Serving]]:
    """(max_in_flight, the invariance servings) a hello declares; ValueError names a bad field."""
    n = hello.get("max_in_flight", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f'hello "max_in_flight" must be an integer >= 1, got {n!r}')
    cache = hello.get("prefix_cache", False)
    if not isinstance(cache, bool):
        raise ValueError(f'hello "prefix_cache" must be true or false, got {cache!r}')
    caps = hello.get("capabilities", [])
    servings = {Serving.BATCH, Serving.CONCURRENCY} if n > 1 else set()
    if PREFILL_CHUNK in caps:
        servings.add(Serving.CHUNKED_PREFILL)
    if cache:
        servings.add(Serving.PREFIX_CACHE)
    if SPECULATIVE in caps:
        servings.add(Serving.SPECULATIVE)
    return n, frozenset(servings)


class Overlap:
    """Sends requests keeping up to `window` outstanding and pairs each reply with its request.

    `proc` is the command engine (its _write, _next_line, _fail and options); `declared` its
    hello's max_in_flight."""

    def __init__(self, proc, declared: int, window: int):
        self.proc = proc
        self.declared = declared
        self.window = window
        # ids answered since the process started (the engine's): a late second reply is one too many
        self.answered: set[str] = proc.answered_ids

    def check_window(self) -> None:
        if self.window > self.declared:
            raise self.proc._fail(
                f"{self.window} requests in flight were asked for, and its hello declares max_in_flight = "
                f"{self.declared} (rule: never more requests outstanding than max_in_flight)")

    def run(self, reqs: Sequence[dict]) -> Iterator[tuple[dict, dict, float]]:
        """Yield (request, reply, seconds from send to reply) as each reply arrives; a new request
        goes out whenever fewer than `window` are outstanding."""
        self.check_window()
        todo = list(reqs)
        waiting: dict[str, tuple[dict, float]] = {}
        while todo or waiting:
            while todo and len(waiting) < self.window:
                req = todo.pop(0)
                self._send(req, len(waiting))
                waiting[req["id"]] = (req, time.perf_counter())
            obj = self._reply(waiting)
            rid = obj.get("id")
            if rid not in waiting:
                why = ("it was answered already (more replies than requests)" if rid in self.answered
                       else f"no request with that id is in flight (in flight: {sorted(waiting)!r})")
                raise self.proc._fail(f"a reply for id {rid!r}: {why}; rule: one reply per request, for an "
                                      "id the gate sent and has not had answered")
            req, t0 = waiting.pop(rid)
            self.answered.add(rid)
            yield req, obj, time.perf_counter() - t0

    def _send(self, req: dict, outstanding: int) -> None:
        timeout = self.proc.options.timeout_s
        try:
            self.proc._write(req, time.monotonic() + timeout)
        except TimeoutError:
            raise self.proc._fail(
                f"it did not read request {req['id']!r} within timeout_s = {timeout:g} s with {outstanding} "
                f"outstanding; its hello declares max_in_flight = {self.declared} (rule: an engine accepts "
                "up to max_in_flight requests; it refused one)") from None
        except (BrokenPipeError, ConnectionResetError):
            raise self.proc._exited(f"before request {req['id']!r} was sent (stdin closed)") from None

    def _reply(self, waiting: dict) -> dict:
        timeout = self.proc.options.timeout_s
        what = (f"a reply with {len(waiting)} requests in flight (rule: an engine whose hello declares "
                f"max_in_flight = {self.declared} answers while that many are outstanding)")
        raw = self.proc._next_line(time.monotonic() + timeout, what=what, timeout_name="timeout_s", timeout=timeout)
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise self.proc._fail(f"a malformed JSON line with {len(waiting)} requests in flight: {raw[:200]!r}") from None
        if not isinstance(obj, dict) or "event" in obj:
            raise self.proc._fail(f"with requests in flight a line must be a reply object (no events), got {raw[:200]!r}")
        return obj


def overlapped(engine, requests: Sequence[dict], window: int, *, sliding: bool,
               record: Callable[[dict, dict, float], object]) -> Iterator:
    """The records of `requests`, `window` in flight at a time, in the order their replies come:
    sliding (concurrency) tops the window up after each reply; otherwise (a batch) each group of
    `window` is sent together and answered in full before the next. An interrupt or an internal
    error mid-way leaves the stream out of step: the engine is killed."""
    ov = Overlap(engine, engine.max_in_flight, window)
    groups = [requests] if sliding else [requests[i : i + window] for i in range(0, len(requests), window)]
    try:
        for group in groups:
            for req, obj, dt in ov.run(group):
                yield record(req, obj, dt)
    except EngineError:
        raise
    except BaseException:
        engine._kill()
        raise
