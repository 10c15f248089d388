"""What the gate accepts in a command engine's replies (strict-gate/engine@1, docs/engine-protocol.md).

Kept apart from the process handling in command.py so that every rule the protocol page
promises is here, in one place, and testable without starting a process. Each function
returns the parsed reply or raises ReplyError saying what is wrong; the caller kills the
engine and quotes the reply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TypeGuard

from strict_gate.engines.base import DumpReply
from strict_gate.errors import InputError
from strict_gate.runs.audit import LOGPROB_EPS
from strict_gate.runs.reader import parse_record
from strict_gate.runs.records import Record, Sampling, ScoredStep, sort_topk


class ReplyError(Exception):
    """A reply that breaks the protocol; the message says what, for the engine's authors."""


def _is_number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _masked(pair: object) -> bool:
    """A [token_id, -Infinity] pair: the token cannot be chosen; it is read as not listed."""
    return isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], float) and pair[1] == -math.inf


def drop_masked(pairs: object) -> object:
    """`pairs` without its -Infinity pairs (anything that is not a list passes through, for the
    type checks that follow to name it)."""
    return [p for p in pairs if not _masked(p)] if isinstance(pairs, list) else pairs


def generate_record(obj: dict, prompt_ids: Sequence[int], sampling: Sampling, label: str,
                    eos_token_ids: Sequence[int] | None) -> Record:
    """A generate reply (not an error reply) as a Record, checked like a run file's record."""
    d = dict(obj)
    d.setdefault("prompt_token_ids", list(prompt_ids))  # echoing the ids back is optional
    top = d.get("top_logprobs")
    if sampling.top_logprobs == 0 and top == []:
        d["top_logprobs"] = None  # "no logprobs" may be written as absent, null or []
    elif isinstance(top, list):
        d["top_logprobs"] = [drop_masked(step) for step in top]
    try:
        rec = parse_record(d, label, None)
    except InputError as e:
        raise ReplyError(str(e).removeprefix(f"{label}: ")) from None
    # Echoed prompt ids that differ from the ids sent (a binary that re-tokenized, or
    # dropped the BOS) are kept as the engine reported them: the comparator calls that a
    # tokenization_mismatch, a failing verdict with the index where the ids part.
    if len(rec.token_ids) > sampling.max_tokens:
        raise ReplyError(f"{len(rec.token_ids)} tokens for max_tokens = {sampling.max_tokens}")
    if not rec.token_ids and sampling.max_tokens > 0:
        raise ReplyError("no tokens generated")
    if eos_token_ids and rec.finish_reason == "stop" and rec.token_ids[-1] not in eos_token_ids:
        raise ReplyError(
            f'finish_reason "stop" but the last token {rec.token_ids[-1]} is not one of the request\'s '
            f"eos_token_ids {list(eos_token_ids)}"
        )
    if sampling.top_logprobs > 0 and rec.top_logprobs is None:
        raise ReplyError(f'"top_logprobs" is missing (asked for top {sampling.top_logprobs})')
    for i, step in enumerate(rec.top_logprobs or ()):
        if not step:
            raise ReplyError(f'"top_logprobs"[{i}] is empty (it must at least list the chosen token)')
        if len(step) > sampling.top_logprobs + 1:
            raise ReplyError(
                f'"top_logprobs"[{i}] has {len(step)} entries for top_logprobs = {sampling.top_logprobs} '
                "(at most k + 1: the top k plus the chosen token)"
            )
    if rec.timing is not None:
        for name in ("ttft_s", "total_s"):
            v = getattr(rec.timing, name)
            if v is not None and (not _is_number(v) or v < 0):
                raise ReplyError(f'"timing".{name} must be a non-negative number')
    return rec


def _logprob(x: object) -> bool:
    return _is_number(x) and math.isfinite(x) and x <= LOGPROB_EPS


def scored_steps(obj: dict, continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
    """A score reply's steps, one per continuation id. `k` is the top_logprobs the request sent."""
    steps = obj.get("steps")
    if not isinstance(steps, list):
        raise ReplyError('"steps" must be a list')
    if len(steps) != len(continuation_ids):
        raise ReplyError(f'"steps" has {len(steps)} entries for {len(continuation_ids)} continuation ids')
    out = []
    for i, (step, tok) in enumerate(zip(steps, continuation_ids)):
        if not isinstance(step, dict):
            raise ReplyError(f'"steps"[{i}] must be an object')
        if step.get("token_id") != tok:
            raise ReplyError(f'"steps"[{i}].token_id is {step.get("token_id")!r}, expected {tok}')
        lp = step.get("logprob")
        if lp == -math.inf:
            lp = None  # masked: the token is outside any top-k, so its gap is unknown (never a near-tie)
        if lp is not None and not _logprob(lp):
            raise ReplyError(f'"steps"[{i}].logprob must be a finite logprob (<= 0), -Infinity or null, got {lp!r}')
        top = drop_masked(step.get("top"))
        ok = isinstance(top, list) and bool(top) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and not isinstance(p[0], bool)
            and _logprob(p[1]) for p in top
        )
        if not ok:
            raise ReplyError(
                f'"steps"[{i}].top must be a non-empty list of [token_id, logprob] pairs, logprobs finite '
                f"and <= 0, got {step.get('top')!r}"
            )
        assert isinstance(top, list)  # ok says so
        if len(top) > k + 1:
            raise ReplyError(f'"steps"[{i}].top has {len(top)} pairs for top_logprobs = {k} (at most k + 1)')
        if len({p[0] for p in top}) != len(top):
            raise ReplyError(f'"steps"[{i}].top lists a token id twice')
        out.append(ScoredStep(token_id=int(tok), logprob=None if lp is None else float(lp), top=sort_topk(top)))
    return out


def dump_reply(obj: dict) -> DumpReply:
    """A dump reply's form; what the file holds is audited by strict_gate.localize.capture."""
    path, points = obj.get("path"), obj.get("points")
    if not isinstance(path, str) or not path:
        raise ReplyError('"path" must be a non-empty string (the file written inside "directory")')
    if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
        raise ReplyError('"points" must be a list of point names')
    return DumpReply(path=Path(path), points=tuple(points))
