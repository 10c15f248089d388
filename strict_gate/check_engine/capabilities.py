"""The checks of what a command engine's hello declares beyond generate and score: requests in
flight (`max_in_flight` above 1), `prefill_chunk`, `dump`, `graft`, `graft_ops` and `dump_decode`.

A declared capability nobody sends is a claim nobody checked: a gate's invariance variants and
`strict-gate localize` would be the first to use it, and trust it. Each check sends what those
send. Requests in flight and a prefill chunk must give the greedy check's tokens (a flip inside
the tolerance is said, beyond it is a finding: the tokens depend on how they were served). A
dump goes through the localiser's own audit (strict_gate/localize/capture.py), and its
`logits`, where given, must choose the tokens the engine generated; so must a decode-path dump's
(the prompt through prefill, then each generated id alone through the cache), which claims to be
the very computation generate ran: `localize` trusts it exactly where the prefill dump did not
reproduce a divergence. A graft of the engine's own
layer inputs must give its own dump back, and a graft of other inputs must change it: a graft
that is ignored passes the first only. The same at ops, with layer 0's op values.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from strict_gate.check_engine.checklist import Status
from strict_gate.check_engine.probe import SAMPLING, Failed, Probe, Skipped, first_difference
from strict_gate.engines.base import DumpRequest, Serving
from strict_gate.errors import EngineError
from strict_gate.runs.records import Record

Verdict = tuple[Status, str]
GRAFT_REL = 1e-2  # a graft of its own inputs is the same computation: it must come back this close
GRAFT_SCALE = 1.5  # the other inputs: its own, scaled


def _compare(what: str, got: dict[str, Record], runs: dict[str, Record], probe: Probe) -> Verdict:
    """Tokens served another way against the greedy check's: equal, a flip within tolerance, or a finding."""
    notes = []
    for pid, rec in got.items():
        want = runs[pid]
        if rec.error is not None:
            raise Failed(f"{what}: prompt {pid!r}: the engine answered an error: {rec.error!r}")
        i = first_difference(want.token_ids, rec.token_ids)
        if i is None:
            continue
        if i >= min(len(want.token_ids), len(rec.token_ids)):
            raise Failed(f"{what}: prompt {pid!r} ends at {len(rec.token_ids)} tokens, not {len(want.token_ids)}")
        a, b = want.logprob_at(i, want.token_ids[i]), want.logprob_at(i, rec.token_ids[i])
        gap = None if a is None or b is None else a - b
        said = (f"prompt {pid!r} position {i}: {want.token_ids[i]} alone, {rec.token_ids[i]} {what} (the "
                f"alone run's gap " + ("unknown" if gap is None else f"{gap:.3g} nats") + ")")
        if gap is None or gap > probe.tolerance.nats:
            raise Failed(f"the tokens depend on how they are served: {said}; tolerance {probe.tolerance.nats:g}")
        notes.append(said)
    n = sum(len(r.token_ids) for r in got.values())
    if notes:
        return Status.PASS, f"{len(got)} prompts {what}: a flip within the tolerance: " + "; ".join(notes[:2])
    return Status.PASS, f"{len(got)} prompts {what}: the greedy check's {n} tokens"


def in_flight(probe: Probe) -> Verdict:
    command = probe.command
    n = int((command.hello or {}).get("max_in_flight", 1)) if command is not None else 1
    if command is None or Serving.BATCH not in command.servings or n < 2:
        return Status.NOT_APPLICABLE, "max_in_flight is 1: one request at a time"
    runs = probe.need_runs()
    prompts = [probe.prompt(pid) for pid in runs][:n]
    probe.start()
    try:
        got = {r.id: r for r in command.generate_batch(prompts, SAMPLING)}
    except EngineError as e:
        raise Failed(f"{len(prompts)} requests in flight (max_in_flight {n}): {e}") from None
    return _compare(f"in flight together ({len(prompts)} of max_in_flight {n})", got, runs, probe)


def prefill_chunk(probe: Probe) -> Verdict:
    command = probe.command
    if command is None or Serving.CHUNKED_PREFILL not in command.servings:
        return Status.NOT_APPLICABLE, "\"prefill_chunk\" is not declared"
    runs = probe.need_runs()
    longest = max(len(probe.prompt(pid).token_ids) for pid in runs)
    if longest < 2:
        raise Skipped("no prompt of two tokens or more: no prefill can be split")
    chunk = max(1, longest // 3)
    chunked = command.with_prefill_chunk(chunk)
    try:
        chunked.start()
        got = {r.id: r for pid in runs for r in chunked.generate([probe.prompt(pid)], SAMPLING)}
    except EngineError as e:
        raise Failed(f"prefill_chunk {chunk}: {e}") from None
    finally:
        chunked.close()
    return _compare(f"with prefill_chunk {chunk} (the longest prompt {longest} tokens)", got, runs, probe)


def _dump(probe: Probe, where: Path, name: str, ids: tuple[int, ...], points, positions, graft=None,
          decode_from: int | None = None) -> dict:
    from strict_gate.localize.capture import capture

    request = DumpRequest(ids, points, tuple(positions), where / name, graft, decode_from)
    probe.start()
    try:
        return capture(probe.engine, request).tensors
    except EngineError as e:
        raise Failed(f"dump ({name}): {e}") from None


def _undeclared(probe: Probe, op: str) -> str:
    """Why a capability check does not apply: HTTP servers have no hello to declare it in."""
    if probe.command is None and probe.engine.speaks_http:
        return f"the openai engine speaks HTTP (OpenAI completions): it has no {op} op"
    return f"\"{op}\" is not declared"


def dump(probe: Probe) -> Verdict:
    if not probe.engine.can_dump:
        return Status.NOT_APPLICABLE, _undeclared(probe, "dump")
    return _chooses_generated(probe, decode=False)


def dump_decode(probe: Probe) -> Verdict:
    if not (probe.engine.can_dump and probe.engine.can_dump_decode):
        return Status.NOT_APPLICABLE, _undeclared(probe, "dump_decode")
    return _chooses_generated(probe, decode=True)


def _chooses_generated(probe: Probe, *, decode: bool) -> Verdict:
    """A dump of the last 8 positions of a prompt and its generated tokens (prefill, or the decode
    path from the prompt's end), audited; its logits, where given, choose the generated tokens."""
    pid, rec = next(iter(probe.need_runs().items()))
    prompt_len = len(probe.prompt(pid).token_ids)
    ids = probe.prompt(pid).token_ids + rec.token_ids
    positions = range(max(0, len(ids) - 8), len(ids))
    name = "decode-path dump" if decode else "dump"
    with tempfile.TemporaryDirectory(prefix="strict-gate-check-dump-") as tmp:
        tensors = _dump(probe, Path(tmp), name.replace(" ", "-"), ids, None, positions,
                        decode_from=prompt_len if decode else None)
    logits = tensors.get("logits")
    if logits is not None:
        for row, p in enumerate(positions):
            k = p + 1 - prompt_len  # the generated token chosen from position p
            if 0 <= k < len(rec.token_ids) and logits[row][rec.token_ids[k]] < logits[row].max():
                raise Failed(f"{name} of prompt {pid!r}: logits at position {p} put {int(logits[row].argmax())} "
                             f"above {rec.token_ids[k]}, the token generate chose there: the {name} is not of "
                             "this computation")
    where = f", decoded from position {prompt_len}" if decode else ""
    return Status.PASS, (f"{len(tensors)} points at {len(positions)} positions{where}, audited"
                         + ("; its logits choose the generated tokens" if logits is not None else "; no logits"))


def _grafted(probe: Probe, where: Path, ids, feeds: dict, outputs) -> tuple[dict, dict]:
    """Dumps of `outputs` with the engine's own `feeds` grafted, then with them x GRAFT_SCALE."""
    from safetensors.torch import save_file

    save_file(feeds, str(where / "own.safetensors"))
    save_file({k: v * GRAFT_SCALE for k, v in feeds.items()}, str(where / "other.safetensors"))
    every = range(len(ids))
    return (_dump(probe, where, "grafted-own", ids, tuple(outputs), every, where / "own.safetensors"),
            _dump(probe, where, "grafted-other", ids, tuple(outputs), every, where / "other.safetensors"))


def _fed_back(own: dict, same: dict, other: dict, outputs, fed: str, read: str, what: str) -> None:
    """Its own values fed back must give its own outputs; other values must change some."""
    for k in outputs:
        rel = float((same[k] - own[k]).abs().max()) / (float(own[k].abs().max()) or 1.0)
        if rel > GRAFT_REL:
            raise Failed(f"a graft of its own {fed} changes {k} (max rel {rel:.3g}): {what} is not fed "
                         "where docs/engine-protocol.md says")
    if all(bool((other[k] == own[k]).all()) for k in outputs):
        raise Failed(f"a graft of other {fed} (its own x {GRAFT_SCALE}) changes none of the {len(outputs)} {read} "
                     f"({', '.join(outputs)}): {what} is ignored")


def graft(probe: Probe) -> Verdict:
    if not probe.engine.can_graft:
        return Status.NOT_APPLICABLE, _undeclared(probe, "graft")
    from strict_gate.localize.points import layer_inputs

    pid, rec = next(iter(probe.need_runs().items()))
    ids = probe.prompt(pid).token_ids + rec.token_ids
    every = range(len(ids))
    with tempfile.TemporaryDirectory(prefix="strict-gate-check-graft-") as tmp:
        where = Path(tmp)
        own = _dump(probe, where, "own", ids, None, every)
        inputs = {k: v.contiguous() for k, v in own.items() if k in layer_inputs(own)}
        outputs = [k for k in own if k.startswith("layers.")]
        if "embed" not in inputs or not outputs:
            raise Failed(f"a dump of every point holds {sorted(own)}: no embed or no layer to graft")
        same, other = _grafted(probe, where, ids, inputs, outputs)
    _fed_back(own, same, other, outputs, "layer inputs", "layer outputs", "the graft")
    return Status.PASS, (f"its own layer inputs grafted give its own {len(outputs)} layer outputs back; other inputs "
                         "change them")


def graft_ops(probe: Probe) -> Verdict:
    """Its own op values (layer 0's, every position) grafted give its own ops back; other values
    (its own x GRAFT_SCALE) change the ops that read them: a graft at ops that is ignored passes
    the first only (docs/localize.md, "Grafting at ops")."""
    if not probe.engine.can_graft_ops:
        return Status.NOT_APPLICABLE, _undeclared(probe, "graft_ops")
    from strict_gate.localize.graft import FEEDS, inputs_of
    from strict_gate.localize.points import is_op, op_of, ops_of

    pid, rec = next(iter(probe.need_runs().items()))
    ids = probe.prompt(pid).token_ids + rec.token_ids
    every = range(len(ids))
    with tempfile.TemporaryDirectory(prefix="strict-gate-check-graft-ops-") as tmp:
        where = Path(tmp)
        own = _dump(probe, where, "ops", ids, tuple(p for p in ops_of(0) if is_op(p)), every)
        feeds = {k: v.contiguous() for k, v in own.items() if op_of(k) in FEEDS}
        fed = [k for k in own if any(i in feeds for i in inputs_of(k))]
        if not fed:
            raise Failed(f"a dump of layer 0's ops holds {sorted(own)}: no op reads another op point, nothing to "
                         "graft at ops")
        same, other = _grafted(probe, where, ids, feeds, fed)
    _fed_back(own, same, other, fed, "op values", "ops that read them", "the op graft")
    return Status.PASS, f"its own op values grafted give its own {len(fed)} ops back; other values change them"
