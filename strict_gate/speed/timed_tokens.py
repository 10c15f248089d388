"""The speed arm verifies what it times: the tokens of every timed reply are checked.

speed/measure.py audits each timed reply's format as it arrives (the run audit's rules) and
keeps it; here its tokens are judged by the gate's own comparator, at the gate's band and
greedy tolerance, so that no figure is the speed of tokens nobody verified:

- on the gate rung, an arm's full replies against its own gate records (the engine timed is
  the one the token verdict judged), over the gate record's length (the gate stopped at EOS,
  the timed request ignores it);
- every other reply (the ladder rungs, the max_tokens=1 requests, and the gate rung of an arm
  without gate records: `strict-gate bench`, a recorded reference's stand-in) against the
  other arm's reply to the very same request, over their common length.

Both are compared up to the first EOS either emitted, with the EOS ids the timed requests told
the engines to ignore dropped from the top-k where they were not emitted (a masked EOS listed
above the emitted token is no greedy violation). A reply verifies when it matches, or first
diverges at a near-tie that is the last token of both replies. What follows a flip is judged by
the gate's rule (judge/cascade.py): every position after it, in either reply (compared or past
an EOS), is unjudged, since the speed arm does not re-score as the gate does, and so are the
positions a reply that stopped early never emitted (cascade.stop_problem). Those, and anything
else (a choice that is not its own argmax, a divergence beyond a near-tie, other prompt ids),
leave the rung unverified, and the speed verdict fails the gate (speed.verdict.judge_speed).
"""

from __future__ import annotations

from dataclasses import replace

from strict_gate.judge.cascade import stop_problem, unjudged
from strict_gate.judge.compare import Divergence, Status, compare_prompt
from strict_gate.judge.text_only import Decode
from strict_gate.runs.records import Record
from strict_gate.speed.config import TokenRules
from strict_gate.speed.ladder import Request
from strict_gate.speed.measure import ArmRung, TimedKey
from strict_gate.speed.model import Rung, TokenCheck

SHOWN = 3  # problems written out per rung; the count says how many more
NOT_RESCORED = "the speed arm does not re-score, so the tokens it timed after a flip are unverified"
AGREE = (Status.MATCH, Status.NEAR_TIE)
GateRecords = dict[str, dict[str, Record]]  # role -> the arm's gate records by prompt id


def _head(rec: Record, n: int) -> Record:
    """The record's first n tokens (and steps), as if it had been asked for n."""
    if len(rec.token_ids) <= n:
        return rec
    top = None if rec.top_logprobs is None else rec.top_logprobs[:n]
    return replace(rec, token_ids=rec.token_ids[:n], top_logprobs=top, finish_reason="length")


def _past_eos(rec: Record, eos: frozenset[int]) -> Record:
    """The record with the EOS ids it was told to ignore dropped from each step's top-k (where it
    did not emit one): an engine that masks the EOS (transformers' min_new_tokens) lists it
    above the token it emitted, a banned choice that is no top-1 to be greedy against."""
    if not eos or rec.top_logprobs is None:
        return rec
    steps = tuple(tuple(p for p in step if p[0] not in eos or p[0] == t) for t, step in
                  zip(rec.token_ids, rec.top_logprobs))
    return replace(rec, top_logprobs=steps)


def _compared_length(first: Record, second: Record, eos: frozenset[int]) -> int:
    """Their common length, up to the first EOS either emitted: whether an EOS met on the way is
    emitted (vLLM) or masked (transformers) is not compared, and nothing after it is common."""
    n = min(len(first.token_ids), len(second.token_ids))
    return next((i for i in range(n) if first.token_ids[i] in eos or second.token_ids[i] in eos), n)


def _disagreement(first: Record, second: Record, rules: TokenRules, max_tokens: int,
                  decode: Decode | None = None) -> str | None:
    """Why `second` (asked for max_tokens) does not verify against `first` (over their common
    length before an EOS), or None. A text-only reply (its ids a re-tokenization) verifies when
    its text is the other reply's."""
    if decode is not None and _same_text(first, second, decode):
        return None
    n = _compared_length(first, second, rules.eos_ids)
    if n == 0:
        return None if first.token_ids[:1] == second.token_ids[:1] else \
            "nothing to verify: one reply emitted an EOS at position 0 and the other went past it"
    a, b = (_past_eos(_head(r, n), rules.eos_ids) for r in (first, second))
    c = compare_prompt(first.id, a, b, rules.band, rules.greedy_tolerance)
    d = c.first_divergence
    if c.status == Status.NEAR_TIE and d is not None:
        return _after_flip(d, first, second, rules, max_tokens)
    if c.status in AGREE:
        return None
    return f"{c.status} at position {d.position} ({d.reason})" if d is not None else f"{c.status} ({c.detail})"


def _after_flip(d: Divergence, first: Record, second: Record, rules: TokenRules, max_tokens: int) -> str | None:
    """A near-tie flip, by the gate's rule for what follows one (judge/cascade.py): the positions
    after it that either reply went on to are unjudged, and so are those `second` never emitted
    when it stopped early (stop_problem); None only for a flip that ended both replies."""
    end = max(len(first.token_ids), len(second.token_ids))
    after = unjudged(d.position, end, NOT_RESCORED).unverified
    stop = stop_problem(second.token_ids, second.finish_reason, max_tokens, rules.eos_ids or None,
                        who="the timed reply", other="the reply it is checked against")
    why = "; ".join(x for x in (after, stop) if x)
    return f"near_tie at position {d.position} ({d.reason}); {why}" if why else None


def _same_text(a: Record, b: Record, decode: Decode) -> bool:
    def text(r: Record) -> str | None:
        return r.text_only.text if r.text_only is not None else decode(r.prompt_token_ids, r.token_ids)

    return (a.text_only is not None or b.text_only is not None) and a.finish_reason == b.finish_reason \
        and text(a) == text(b)


def _where(role: str, key: TimedKey) -> str:
    rep, request, pid = key
    return f"the {role}'s {request} reply to {pid!r} (repetition {rep})"


def _asked(rung: Rung, key: TimedKey) -> int:
    """The max_tokens a timed request asked for: the rung's, or 1 (the two-request TTFT)."""
    return rung.max_tokens if key[1] is Request.FULL else 1


def check_tokens(rung: Rung, arms: dict[str, ArmRung | None], gate_records: GateRecords,
                 rules: TokenRules, decode: Decode | None = None) -> TokenCheck:
    """Every timed reply of the rung, checked once: against the arm's gate record where it has one
    for the prompt (full replies on the gate rung), else against the other arm's reply."""
    problems: list[str] = []
    checked = 0
    cross: set[TimedKey] = set()
    for role, arm in arms.items():
        if arm is None:
            continue
        own = gate_records.get(role, {}) if rung.prompt_tokens is None else {}
        for key, rec in arm.timed.items():
            gate_rec = own.get(key[2]) if key[1] is Request.FULL else None
            if gate_rec is None or gate_rec.error is not None:
                cross.add(key)
                continue
            checked += 1
            why = _disagreement(gate_rec, rec, rules, _asked(rung, key), decode)
            if why:
                problems.append(f"{_where(role, key)} against its own gate record (as reference): {why}")
    ref, cand = arms.get("reference"), arms.get("candidate")
    if ref is not None and cand is not None:
        for key, rec in ref.timed.items():
            other = cand.timed.get(key)
            if key not in cross or other is None:
                continue
            checked += 1
            why = _disagreement(rec, other, rules, _asked(rung, key), decode)
            if why:
                problems.append(f"{_where('candidate', key)} against the reference's: {why}")
    return TokenCheck(checked, tuple(problems[:SHOWN]), len(problems))
