"""The line-protocol checks (command engines only): the hello, token events, what an engine does
with requests a gate never sends, and EOF.

Raw requests go through CommandEngine.exchange, the gate's own framing and failure handling;
replies are read with the gate's own readers (engines/command/replies.py, speed.py).
"""

from __future__ import annotations

import re

from strict_gate.check_engine.checklist import Status
from strict_gate.check_engine.numerics import dtype_bits, vocabulary
from strict_gate.check_engine.probe import SAMPLING, Failed, Probe
from strict_gate.engines.command.engine import CommandEngine
from strict_gate.engines.command.process import SHUTDOWN_GRACE_S
from strict_gate.engines.command.replies import ReplyError, generate_record
from strict_gate.engines.command.speed import HELLO_SETTINGS, TokenEvents, speed_fields
from strict_gate.runs.records import Record

Verdict = tuple[Status, str]
CAPABILITIES = ("generate", "score", "stream", "dump", "graft", "graft_ops", "dump_decode", "prefill_chunk", "speculative")
UNKNOWN_OP = "strict-gate-check-unknown-op"  # no protocol version will define it
NOISE = re.compile(r"traceback|error|exception|panic|abort|segmentation fault|broken pipe|core dumped", re.I)


def _command(probe: Probe) -> CommandEngine:
    command = probe.command
    assert command is not None, "a protocol check runs on command engines only"
    return command


def hello(probe: Probe) -> Verdict:
    h = _command(probe).hello or {}
    problems = [f"capability {c!r} is not one of {', '.join(CAPABILITIES)} (a gate ignores it)"
                for c in h.get("capabilities", ["generate"]) if c not in CAPABILITIES]
    for key, kind in HELLO_SETTINGS.items():
        v = h.get(key)
        if key in h and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
            problems.append(f"{key!r} is {v!r}, not a {kind.__name__} (the speed arm ignores it)")
    dtype = h.get("dtype")
    if isinstance(dtype, str) and dtype_bits(dtype) is None:
        problems.append(f"dtype {dtype!r} is outside the vocabulary ({vocabulary()}), so the matched check "
                        "cannot rank it")
    if isinstance(h.get("max_context"), int) and h["max_context"] < 1:
        problems.append(f"max_context {h['max_context']!r} is not a positive number of tokens")
    if problems:
        raise Failed("; ".join(problems))
    missing = [k for k in ("name", "version") if not h.get(k)]
    facts = [k for k in HELLO_SETTINGS if k in h]
    return Status.PASS, (f"{h.get('name')} {h.get('version')}: capabilities {', '.join(h.get('capabilities', ['generate']))}"
                         + (f"; states {', '.join(facts)}" if facts else "")
                         + (f"; no {' or '.join(missing)} (strongly advised)" if missing else ""))


def stream(probe: Probe) -> Verdict:
    command = _command(probe)
    if not command.streams:
        return Status.NOT_APPLICABLE, "\"stream\" is not declared"
    runs = probe.need_runs()
    p = probe.prompts[0]
    label = f"streamed prompt {p.id!r}"
    carried: list[object] = []
    events = TokenEvents(p.id, lambda n: None)

    def on_event(obj: dict) -> str | None:
        carried.append(obj.get("token_id"))
        return events(obj)

    req = {"op": "generate", "id": p.id, "prompt_token_ids": list(p.token_ids), "max_tokens": SAMPLING.max_tokens,
           "top_logprobs": SAMPLING.top_logprobs, **speed_fields(SAMPLING, events)}
    if command.eos_token_ids:
        req["eos_token_ids"] = list(command.eos_token_ids)
    obj = command.exchange(req, label, on_event)
    if "error" in obj:
        raise Failed(f"{label}: the engine answered an error: {obj['error']!r}")
    try:
        rec = generate_record(obj, p.token_ids, SAMPLING, label, command.eos_token_ids)
    except ReplyError as e:
        raise Failed(f"{label}: invalid response: {e}") from None
    events.check(rec, Failed)
    if tuple(carried) != rec.token_ids:
        raise Failed(f"{label}: the events carry {carried}, the reply's token_ids are {list(rec.token_ids)}: "
                     "one event per token, in order")
    if rec.token_ids != runs[p.id].token_ids:
        raise Failed(f"{label}: {list(rec.token_ids)}, but {list(runs[p.id].token_ids)} unstreamed")
    return Status.PASS, f"{len(carried)} token events, the reply's ids in order, then the reply"


def _still_serving(probe: Probe, after: str) -> None:
    """The next ordinary request after `after` is answered as before it."""
    runs = probe.need_runs()
    p = probe.prompts[0]
    rec: Record = probe.generate(p)
    if rec.token_ids != runs[p.id].token_ids:
        raise Failed(f"after {after}, prompt {p.id!r} generates {list(rec.token_ids)} instead of "
                     f"{list(runs[p.id].token_ids)}")


def _error_reply(probe: Probe, req: dict, what: str) -> str:
    obj = _command(probe).exchange(req, what)
    if not isinstance(obj.get("error"), str) or not obj["error"]:
        raise Failed(f"{what}: answered {str(obj)[:200]}, not {{\"id\": {req['id']!r}, \"error\": \"...\"}}")
    _still_serving(probe, what)
    return obj["error"]


def unknown_op(probe: Probe) -> Verdict:
    why = _error_reply(probe, {"op": UNKNOWN_OP, "id": "check-unknown-op"}, f"an unknown op ({UNKNOWN_OP!r})")
    return Status.PASS, f"answered {why!r} and went on serving"


def malformed(probe: Probe) -> Verdict:
    p = probe.prompts[0]
    req = {"op": "generate", "id": "check-malformed", "prompt_token_ids": " ".join(map(str, p.token_ids)),
           "max_tokens": SAMPLING.max_tokens, "top_logprobs": SAMPLING.top_logprobs}
    why = _error_reply(probe, req, "a generate request whose prompt_token_ids is a string")
    return Status.PASS, f"answered {why!r} and went on serving"


def eof(probe: Probe) -> Verdict:
    code, stderr = _command(probe).end_of_input(SHUTDOWN_GRACE_S)
    said = f"; its stderr after the EOF: {stderr.strip()[-300:]!r}" if stderr.strip() else ""
    if code is None:
        raise Failed(f"still running {SHUTDOWN_GRACE_S:g} s after its stdin closed (a gate then SIGTERMs "
                     f"its group){said}")
    if code != 0:
        raise Failed(f"exited with {'signal ' + str(-code) if code < 0 else 'code ' + str(code)} when its stdin "
                     f"closed, not 0{said}")
    noise = [ln for ln in stderr.splitlines() if NOISE.search(ln)]
    if noise:
        raise Failed(f"exit 0, but its stderr after the EOF reads like a failure: {noise[0].strip()[:200]!r}")
    return Status.PASS, "exit 0 when its stdin closed" + (said or ", nothing on stderr")
