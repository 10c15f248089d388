"""The checks of an engine spoken to over HTTP (kind openai), above all a text-only server.

A text-only server (`text_only = true`) returns text, usage and nothing else, so what can be
checked is what it states: that it read each prompt as the gate tokenized it (usage.prompt_tokens,
and its /tokenize where it has one), and that a streamed reply is the same text as the plain one,
its first delta inside the request. A gate's token runs never stream a text-only server (only
`[speed]` does), so a stream that does not hold is said, not failed. Greedy decoding, logprobs
and ties cannot be seen in text; the generate checks say so instead of passing on nothing
(generation.py asks `text_only`).
"""

from __future__ import annotations

from collections.abc import Mapping

from strict_gate.check_engine.checklist import Status
from strict_gate.check_engine.probe import SAMPLING, Failed, Probe
from strict_gate.engines.base import Engine
from strict_gate.errors import StrictGateError
from strict_gate.runs.records import Record

Verdict = tuple[Status, str]


def text_only(engine: Engine) -> bool:
    """An arm that sends text and gets text back (no token ids, no logprobs)."""
    return bool(getattr(engine.options, "text_only", False))


def generated(rec: Record) -> int:
    """How many tokens the engine generated: a text-only server's own count (usage), else the ids."""
    n = rec.text_only.usage_completion_tokens if rec.text_only is not None else None
    return len(rec.token_ids) if n is None else n


def not_protocol(probe: Probe) -> str:
    """Why a line-protocol check does not apply to this engine."""
    if probe.engine.speaks_http:
        return ("the openai engine speaks HTTP (OpenAI completions), not the line protocol: there is no hello, "
                "raw request or stdin to check")
    return f"protocol only: the {probe.engine.kind} engine does not speak the line protocol"


def prompt_honoured(runs: Mapping[str, Record]) -> str:
    """A text-only server read each prompt as the gate tokenized it (usage, /tokenize), said in
    words; Failed when it did not (it ignored the prompt, or added or dropped a BOS)."""
    for pid, rec in runs.items():
        why = rec.text_only.misread(rec.prompt_token_ids) if rec.text_only is not None else "not a text-only reply"
        if why:
            raise Failed(f"prompt {pid!r}: {why}")
    tokenize = any(r.text_only is not None and r.text_only.server_prompt_token_ids is not None for r in runs.values())
    how = "usage.prompt_tokens and /tokenize agree" if tokenize else "usage.prompt_tokens agrees (no /tokenize)"
    return f"the prompts were sent as text, and {how} with each prompt's ids"


def http_stream(probe: Probe) -> Verdict:
    """A streamed reply against the plain one; for a text-only server, whose token runs a gate
    never streams, what went wrong is said as not applicable instead of failing the server."""
    engine = probe.engine
    if probe.command is not None:
        return Status.NOT_APPLICABLE, "a command engine's token events are the stream check's"
    if not engine.streams:
        return Status.NOT_APPLICABLE, f"the {engine.kind} engine does not stream"
    if not text_only(engine):
        return _streamed(probe)
    try:
        return _streamed(probe)
    except (Failed, StrictGateError) as e:
        return Status.NOT_APPLICABLE, (f"a gate's token runs never stream a text-only server; only [speed] would, "
                                       f"and its rungs would not be measured: {e}")


def _streamed(probe: Probe) -> Verdict:
    engine = probe.engine
    runs = probe.need_runs()
    p = probe.prompts[0]
    deltas: list[int] = []
    probe.start()
    rec = engine.stream_one(p, SAMPLING, deltas.append)
    plain = runs[p.id]
    if rec.error is not None:
        raise Failed(f"streamed prompt {p.id!r}: the engine answered an error: {rec.error!r}")
    if rec.token_ids != plain.token_ids or rec.finish_reason != plain.finish_reason:
        raise Failed(f"streamed prompt {p.id!r}: {list(rec.token_ids)} ({rec.finish_reason!r}), not the plain "
                     f"request's {list(plain.token_ids)} ({plain.finish_reason!r})")
    t = rec.timing
    if not deltas or t is None or t.ttft_s is None:
        raise Failed(f"streamed prompt {p.id!r}: no delta arrived before the end of the stream")
    if t.total_s is not None and t.ttft_s > t.total_s:
        raise Failed(f"streamed prompt {p.id!r}: first delta at {t.ttft_s:.4f} s, after the whole request")
    what = "text deltas" if text_only(engine) else "chunks"
    return Status.PASS, (f"server-sent events: {len(deltas)} {what}, the same reply as the plain request, first "
                         f"after {t.ttft_s * 1000:.1f} ms")
