"""The command protocol's additions for `strict-gate bench` (additive to strict-gate/engine@1).

- `"ignore_eos": true` in a generate request: produce exactly max_tokens (an engine that
  does not know the field ignores it; the gate records the real token count either way).
- `"stream": true` in a generate request, sent only to an engine whose hello lists the
  capability "stream": the engine writes one `{"event": "token", "id": ID, "token_id": T}`
  line per generated token, as it is generated, before its normal response. The events must
  carry the response's `token_ids`, in order, one each. The gate timestamps each line on
  receipt and the response when it arrives: time to first token and decode rate (until the
  response) are measured from outside, like every other engine kind.
- optional hello fields for the matched-config check: "dtype", "eager", "kv_cache",
  "prefix_cache", "max_context".

Specified in docs/engine-protocol.md, section 5 (events and the speed arm).
"""

from __future__ import annotations

from collections.abc import Callable

from strict_gate.runs.records import Record, Sampling

HELLO_SETTINGS = {"dtype": str, "eager": bool, "kv_cache": str, "prefix_cache": bool, "max_context": int}


def speed_fields(sampling: Sampling, events: TokenEvents | None) -> dict:
    """The optional request fields: sent only when asked for, so a plain gate's requests stay as they were."""
    out: dict = {}
    if sampling.ignore_eos:
        out["ignore_eos"] = True
    if events is not None:
        out["stream"] = True
    return out


def hello_settings(hello: dict | None) -> dict:
    """The hello's optional speed facts, kept only where they have the documented type."""
    hello = hello or {}
    return {k: hello[k] for k, t in HELLO_SETTINGS.items()
            if isinstance(hello.get(k), t) and not (t is int and isinstance(hello[k], bool))}


class TokenEvents:
    """Validates a request's token events and hands each one to on_token as it arrives."""

    def __init__(self, request_id: str, on_token: Callable[[int], None]):
        self.request_id = request_id
        self.on_token = on_token
        self.token_ids: list[int] = []

    def __call__(self, obj: dict) -> str | None:
        """One event line; returns why it is invalid, or None."""
        if obj.get("event") != "token":
            return f'unknown event {obj.get("event")!r} (only "token" is defined)'
        if obj.get("id") != self.request_id:
            return f"token event for id {obj.get('id')!r} while serving {self.request_id!r}"
        t = obj.get("token_id")
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            return '"token_id" of a token event must be a non-negative integer'
        self.token_ids.append(t)
        self.on_token(1)
        return None

    def check(self, rec: Record, fail: Callable[[str], Exception]) -> Record:
        """Fail closed: the events are the response's tokens, in order, or the engine streamed
        something other than what it answered (and its stream timed nothing)."""
        if rec.error is not None or tuple(self.token_ids) == rec.token_ids:
            return rec
        n, m = len(self.token_ids), len(rec.token_ids)
        if n != m:
            raise fail(f"prompt {self.request_id!r}: {n} token events for {m} tokens")
        i = next(i for i, (a, b) in enumerate(zip(self.token_ids, rec.token_ids)) if a != b)
        raise fail(f"prompt {self.request_id!r}: token event {i} carries token {self.token_ids[i]}, "
                   f"the response's token {i} is {rec.token_ids[i]} (the events must be the response's "
                   "token_ids, in order)")
