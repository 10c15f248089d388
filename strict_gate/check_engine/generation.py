"""The generate checks: they run through the Engine interface, so they apply to every live kind.

Each returns its pass (or not-applicable) detail and raises Failed with what it saw. The greedy
check's records (Probe.runs) are the yardstick of the others: a greedy engine gives the same
tokens for the same prompt whatever else changes (max_tokens, top_logprobs, the request before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from strict_gate.check_engine.checklist import Status
from strict_gate.check_engine.http import generated, prompt_honoured, text_only
from strict_gate.check_engine.probe import MAX_TOKENS, SAMPLING, TOP_K, Failed, Probe, Skipped, first_difference
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE, greedy_violation
from strict_gate.runs.records import Record, Sampling

Verdict = tuple[Status, str]
TIMING_SLACK_S = 0.005  # the engine's clock and the gate's are read microseconds apart


def _differs(what: str, a: Record, b: Record) -> str | None:
    i = first_difference(a.token_ids, b.token_ids)
    if i is None:
        return None
    return (f"{what}: the tokens part at position {i}: {list(a.token_ids[i:i + 3])} "
            f"then {list(b.token_ids[i:i + 3])}")


def greedy(probe: Probe) -> Verdict:
    for p in probe.prompts:
        probe.runs[p.id] = probe.generate(p)
    for pid, rec in probe.runs.items():
        v = greedy_violation(rec, DEFAULT_GREEDY_TOLERANCE)
        if v is not None:
            raise Failed(f"prompt {pid!r} step {v.position}: chose {v.chosen} although {v.top1} is "
                         f"{v.gap:.3g} nats higher (greedy_tolerance {DEFAULT_GREEDY_TOLERANCE:g}): use the "
                         "engine's own argmax")
    n = sum(len(r.token_ids) for r in probe.runs.values())
    if text_only(probe.engine):
        return Status.PASS, (f"{len(probe.runs)} prompts, {n} tokens of text tokenized in context: every reply "
                             f"passes the run audit; {prompt_honoured(probe.runs)}; greedy cannot be seen without "
                             "logprobs (a text-only server)")
    return Status.PASS, f"{len(probe.runs)} prompts, {n} tokens: every reply passes the run audit and is greedy"


def _logprob_gap(a: Record, b: Record) -> float:
    """The largest |Δ| between the chosen tokens' logprobs of two records with the same tokens."""
    gaps = [abs(x - y) for i, t in enumerate(a.token_ids)
            if (x := a.logprob_at(i, t)) is not None and (y := b.logprob_at(i, t)) is not None]
    return max(gaps, default=0.0)


def determinism(probe: Probe) -> Verdict:
    runs = probe.need_runs()
    ids = list(runs)
    last, first = probe.prompt(ids[-1]), probe.prompt(ids[0])
    before = runs[last.id]
    if probe.generated[-1].record is not before:  # the greedy check stopped early: pair them here
        before = probe.generate(last)
    pairs = [("the same request twice in a row", before, probe.generate(last)),
             (f"prompt {first.id!r} again after {len(probe.generated) - 1} other requests", runs[first.id],
              probe.generate(first))]
    tol = probe.tolerance.nats
    for what, a, b in pairs:
        why = _differs(what, a, b)
        if why:
            raise Failed(why)
        gap = _logprob_gap(a, b)
        if gap > tol:
            raise Failed(f"{what}: the same tokens, but logprobs {gap:.3g} nats apart (tolerance {tol:g})")
    if text_only(probe.engine):
        return Status.PASS, "the same text twice in a row and after other prompts (no logprobs to compare)"
    gap = max(_logprob_gap(a, b) for _, a, b in pairs)
    return Status.PASS, f"same tokens twice in a row and after other prompts; logprobs within {gap:.3g} nats"


def _longest(probe: Probe) -> tuple[str, Record]:
    runs = probe.need_runs()
    return max(runs.items(), key=lambda kv: len(kv[1].token_ids))


def max_tokens(probe: Probe) -> Verdict:
    pid, full = _longest(probe)
    limits = [n for n in (1, 3) if n < generated(full)]
    if not limits:
        return Status.NOT_APPLICABLE, "every greedy continuation ended at its first token"
    for n in limits:
        rec = probe.generate(probe.prompt(pid), Sampling(n, TOP_K))
        why = _differs(f"prompt {pid!r} with max_tokens {n}", replace(full, token_ids=full.token_ids[:n]), rec)
        if why:
            raise Failed(why + f" (the first {n} of its max_tokens {MAX_TOKENS} continuation)")
        if rec.finish_reason != "length" or generated(rec) != n:
            raise Failed(f"prompt {pid!r} with max_tokens {n}: {generated(rec)} tokens, finish_reason "
                         f"{rec.finish_reason!r}, not {n} and \"length\"")
    return Status.PASS, f"max_tokens {', '.join(map(str, limits))}: that many tokens, \"length\", the same prefix"


def _stops(probe: Probe) -> tuple[str, Record, list[int]] | None:
    """A continuation and positions of tokens that first appear there (not the first token, not an
    EOS): the check's own stop ids."""
    eos = set(probe.model_eos() or ())
    for pid, rec in sorted(probe.need_runs().items(), key=lambda kv: -len(kv[1].token_ids)):
        toks = rec.token_ids
        end = len(toks) - (1 if rec.finish_reason == "stop" else 0)
        firsts = [i for i in range(1, end) if toks[i] not in toks[:i] and toks[i] not in eos]
        if firsts:
            return pid, rec, firsts
    return None


def _natural_eos(probe: Probe) -> str | None:
    """Each record against the ids it was to stop on: an EOS mid-sequence, or at the end
    without "stop", is a failure. Returns a note of what was seen, or None when no EOS came up."""
    seen = None
    for g in probe.generated:
        if g.eos is None or g.sampling.ignore_eos:
            continue
        toks = g.record.token_ids
        early = next((i for i, t in enumerate(toks[:-1]) if t in g.eos), None)
        if early is not None:
            raise Failed(f"{g.label}: token {early} is EOS id {toks[early]} (of {list(g.eos)}) and it went on")
        if toks and toks[-1] in g.eos:
            if g.record.finish_reason != "stop":
                raise Failed(f"{g.label}: ends on EOS id {toks[-1]} with finish_reason {g.record.finish_reason!r}")
            seen = f"{g.label} stopped on EOS id {toks[-1]} with \"stop\""
    return seen


def _text_eos(probe: Probe) -> Verdict:
    """A text-only server: its text holds no EOS, its usage says where it stopped."""
    for pid, rec in probe.need_runs().items():
        if rec.finish_reason == "stop":
            if generated(rec) >= SAMPLING.max_tokens:
                raise Failed(f"prompt {pid!r}: \"stop\" after {generated(rec)} tokens, max_tokens {SAMPLING.max_tokens}")
            return Status.PASS, (f"prompt {pid!r} stopped with \"stop\" after {generated(rec)} tokens (usage), before "
                                 "max_tokens; the EOS itself is not in the text")
    return Status.NOT_APPLICABLE, "no greedy continuation stopped before max_tokens; no EOS to check"


def eos(probe: Probe) -> Verdict:
    if text_only(probe.engine):
        return _text_eos(probe)
    natural = _natural_eos(probe)
    if probe.command is None:
        if natural is None:
            return Status.NOT_APPLICABLE, (f"no continuation reached an EOS id of the model "
                                           f"({list(probe.model_eos() or [])}); none to check")
        return Status.PASS, natural
    found = _stops(probe)
    if found is None:
        return Status.NOT_APPLICABLE, "no continuation long enough to choose stop ids from"
    pid, full, firsts = found
    i, j = firsts[0], firsts[-1]
    ids = (full.token_ids[j], full.token_ids[i]) if j != i else (full.token_ids[i],)
    rec = probe.generate(probe.prompt(pid), eos=ids)
    if rec.token_ids != full.token_ids[:i + 1] or rec.finish_reason != "stop":
        raise Failed(f"prompt {pid!r} with eos_token_ids {list(ids)}: {list(rec.token_ids)} "
                     f"({rec.finish_reason!r}); expected to stop at position {i} on {full.token_ids[i]}, "
                     f"\"stop\": every id of the list ends the sequence")
    default = probe.model_eos()
    sent = f"the arm sends eos_token_ids {list(default)}" if default else \
        "the arm sends no eos_token_ids (no tokenizer, no option): the engine stops on its own"
    return Status.PASS, (f"stopped on eos_token_ids {list(ids)} at position {i}, \"stop\", EOS included; "
                         f"otherwise {sent}" + (f"; {natural}" if natural else ""))


def ignore_eos(probe: Probe) -> Verdict:
    sampling = replace(SAMPLING, ignore_eos=True)
    if probe.command is not None:
        found = _stops(probe)
        if found is None:
            return Status.NOT_APPLICABLE, "no continuation long enough to choose stop ids from"
        pid, full, firsts = found
        at, ids = firsts[0], (full.token_ids[firsts[0]],)
        control = probe.generate(probe.prompt(pid), eos=ids)
        if control.token_ids != full.token_ids[:at + 1]:
            raise Skipped(f"prompt {pid!r} does not stop on eos_token_ids {list(ids)} without ignore_eos (see eos), "
                          "so ignoring them would prove nothing")
    else:
        stopped = [(pid, r) for pid, r in probe.need_runs().items() if r.finish_reason == "stop"]
        if not stopped:
            return Status.NOT_APPLICABLE, "no greedy continuation stopped on an EOS, so none to ignore"
        pid, full = stopped[0]
        # the EOS's position: a text-only reply's text holds no EOS, so it comes after all its tokens
        at, ids = len(full.token_ids) - (0 if text_only(probe.engine) else 1), None
    rec = probe.generate(probe.prompt(pid), sampling, eos=ids)
    if rec.token_ids == full.token_ids[:at + 1] and rec.finish_reason == "stop":
        return Status.NOT_APPLICABLE, ("it stopped at the EOS: the engine does not implement ignore_eos (optional, "
                                       "section 5); `strict-gate bench` then times other lengths than the other arm")
    if generated(rec) != MAX_TOKENS:
        raise Failed(f"prompt {pid!r} with ignore_eos: {generated(rec)} tokens, expected max_tokens = {MAX_TOKENS}")
    why = _differs(f"prompt {pid!r} with ignore_eos, before the EOS", replace(full, token_ids=full.token_ids[:at]),
                   replace(rec, token_ids=rec.token_ids[:at]))
    if why:
        raise Failed(why)
    if text_only(probe.engine):
        return Status.PASS, (f"{MAX_TOKENS} tokens (usage) past the EOS after {at} token(s) of text, the same text "
                             f"before it, {rec.finish_reason!r}")
    how = "emitted, decoding went on" if rec.token_ids[at] == full.token_ids[at] else "masked"
    return Status.PASS, f"{MAX_TOKENS} tokens past the EOS at position {at} ({how}), {rec.finish_reason!r}"


def top_logprobs(probe: Probe) -> Verdict:
    if text_only(probe.engine):
        return Status.NOT_APPLICABLE, "a text-only server returns no logprobs (none are asked for)"
    runs = probe.need_runs()
    first = probe.prompts[0]
    ref = runs[first.id]
    for k in (0, 1):
        rec = probe.generate(first, Sampling(MAX_TOKENS, k))
        why = _differs(f"prompt {first.id!r} with top_logprobs {k}", ref, rec)
        if why:
            raise Failed(why + " (top_logprobs must not change the decoding)")
        gap = _logprob_gap(ref, rec)
        if gap > probe.tolerance.nats:
            raise Failed(f"prompt {first.id!r}: chosen logprobs {gap:.3g} nats apart between top_logprobs {k} and {TOP_K}")
    for pid, rec in runs.items():
        short = next(((i, len(s)) for i, s in enumerate(rec.top_logprobs or ()) if len(s) < TOP_K), None)
        if short is not None:
            raise Failed(f"prompt {pid!r} step {short[0]}: asked for the top {TOP_K}, it lists {short[1]} "
                         "(near-ties are judged on the alternatives)")
    return Status.PASS, f"top_logprobs 0, 1 and {TOP_K}: the same tokens and logprobs, {TOP_K} pairs a step"


def _tied_steps(records: Sequence[tuple[str, Record]]):
    """(label, step, chosen, the lowest other id with the chosen token's logprob) at each step whose
    argmax is an exact tie."""
    for label, rec in records:
        for s, (tok, step) in enumerate(zip(rec.token_ids, rec.top_logprobs or ())):
            lp = dict(step).get(tok)
            tied = [t for t, x in step if x == lp and t != tok]
            if lp is not None and tied and lp >= max(x for _, x in step):
                yield label, s, tok, min(tied)


def ties(probe: Probe) -> Verdict:
    if text_only(probe.engine):
        return Status.NOT_APPLICABLE, "a text-only server returns no logprobs: ties at the argmax cannot be seen"
    records = [(g.label, g.record) for g in probe.generated]
    seen = list(_tied_steps(records))
    if not seen:
        steps = sum(len(r.token_ids) for _, r in records)
        return Status.NOT_APPLICABLE, f"no exact tie at the argmax in the {steps} steps generated"
    for label, s, tok, other in seen:
        if other < tok:
            raise Failed(f"{label} step {s}: chose {tok} although {other} has the same logprob: an exact tie "
                         "goes to the lowest id (torch.argmax, vLLM)")
    return Status.PASS, f"{len(seen)} exact ties at the argmax, each to the lowest id"


def timing(probe: Probe) -> Verdict:
    if not probe.generated:
        raise Skipped("no generate request was answered (see greedy)")
    for g in probe.generated:
        t = g.record.timing
        if t is None:
            continue
        if t.total_s is not None and t.total_s > g.wall_s + TIMING_SLACK_S:
            raise Failed(f"{g.label}: reports total_s = {t.total_s:g} s, but the request took {g.wall_s:.4f} s on "
                         "the gate's clock (seconds, not milliseconds)")
        total = g.wall_s if t.total_s is None else min(t.total_s, g.wall_s)
        if t.ttft_s is not None and t.ttft_s > total + TIMING_SLACK_S:
            raise Failed(f"{g.label}: reports ttft_s = {t.ttft_s:g} s, after the whole request ({total:.4f} s)")
    slowest = max(g.wall_s for g in probe.generated)
    command = probe.command
    budget = f" of timeout_s = {command.options.timeout_s:g} s" if command is not None else ""
    return Status.PASS, (f"{len(probe.generated)} requests, the slowest {slowest:.3f} s{budget}; every reported "
                         "timing fits inside the gate's clock")
