"""The score checks: the op answers as declared, and prefill agrees with decode.

A plain gate never sends `score` to the candidate (only `drift = true` does), so a broken score
op goes unnoticed until then; here it is exercised on the engine's own greedy continuations. A
gap between what score and generate say about the same tokens is an engine finding (the prompt
path and the decode path compute differently: the class of difference behind a near-tie flipped
by a prefill in another reduction order), not a protocol error.
"""

from __future__ import annotations

from strict_gate.check_engine.checklist import Status
from strict_gate.check_engine.probe import TOP_K, Failed, Probe, Skipped
from strict_gate.runs.records import Record, ScoredStep

Verdict = tuple[Status, str]
UNDECLARED_SCORE_ID = "check-score-undeclared"


def score(probe: Probe) -> Verdict:
    pid, rec = next(iter(probe.need_runs().items()))
    prompt = probe.prompt(pid)
    if probe.engine.can_score:
        probe.score_works = False
        steps = probe.score(prompt, rec.token_ids)
        probe.score_works = True
        return Status.PASS, f"declared, and a score request over {len(steps)} tokens gets a valid reply"
    command = probe.command
    if command is None:
        return Status.NOT_APPLICABLE, f"the {probe.engine.kind} engine cannot score"
    req = {"op": "score", "id": UNDECLARED_SCORE_ID, "prompt_token_ids": list(prompt.token_ids),
           "continuation_ids": list(rec.token_ids), "top_logprobs": TOP_K}
    obj = command.exchange(req, f"score request {UNDECLARED_SCORE_ID!r} (not declared in the hello)")
    if "error" not in obj:
        raise Failed("answers score although its hello does not declare it: a gate never sends it score "
                     "(no drift, no re-scoring); add \"score\" to the capabilities")
    return Status.PASS, f"not declared, and a score request gets an error reply ({obj['error']!r})"


def _scored_logprob(step: ScoredStep, token: int) -> float | None:
    if step.logprob is not None:
        return step.logprob
    return dict(step.top).get(token)


def _gaps(rec: Record, steps: list[ScoredStep]) -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
    """(position, the largest |Δ logprob| of a token both sides list there: the chosen one and
    every one in both top lists), (position, how far the prefill's argmax is above decode's,
    where they differ), and how many positions had no figure on one side. The top lists are
    compared too: a diagnosis reads them, not only the chosen token's logprob."""
    gaps, flips, unknown = [], [], 0
    for i, (tok, step) in enumerate(zip(rec.token_ids, steps)):
        b = _scored_logprob(step, tok)
        scored = dict(step.top) | ({tok: b} if b is not None else {})
        generated = dict(rec.top_logprobs[i]) if rec.top_logprobs is not None and i < len(rec.top_logprobs) else {}
        both = [abs(generated[t] - scored[t]) for t in scored if t in generated]
        best = max(generated, key=lambda t: generated[t]) if generated else tok  # decode's own argmax
        if step.argmax != best and best in scored:
            flips.append((i, step.top[0][1] - scored[best]))
        if tok not in generated or b is None:
            unknown += 1
        if both:
            gaps.append((i, max(both)))
    return gaps, flips, unknown


def prefill_decode(probe: Probe) -> Verdict:
    if not probe.engine.can_score:
        why = "score is not declared" if probe.command is not None else f"the {probe.engine.kind} engine cannot score"
        return Status.NOT_APPLICABLE, f"{why}: nothing to compare generate with"
    if not probe.score_works:
        raise Skipped("the score op did not work (see score)")
    worst: tuple[float, str, int] = (0.0, "", 0)
    flips: list[tuple[float, str]] = []
    positions = unknown = 0
    for pid, rec in probe.need_runs().items():
        gaps, flipped, missing = _gaps(rec, probe.score(probe.prompt(pid), rec.token_ids))
        positions += len(gaps)
        unknown += missing
        flips += [(above, f"{pid!r}:{i}") for i, above in flipped]
        for i, gap in gaps:
            if gap > worst[0]:
                worst = (gap, pid, i)
    gap, pid, i = worst
    tol = probe.tolerance.nats
    detail = f"max |Δ logprob| {gap:.3g} nats over {positions} positions (the chosen token and both top lists)"
    if gap > 0:
        detail += f", at prompt {pid!r} position {i}"
    detail += f"; tolerance {tol:g}"
    if flips:
        far = max(flips)
        detail += (f"; the prefill's argmax is another token at {len(flips)} position(s) ({', '.join(w for _, w in flips[:3])}), "
                   f"up to {far[0]:.3g} nats above decode's (at {far[1]})")
    if unknown:
        detail += f"; {unknown} position(s) without the chosen token's logprob on one side"
    if gap > tol or (flips and max(flips)[0] > tol):
        raise Failed(f"prefill (score) and decode (generate) compute differently: {detail}")
    if positions and gap == 0:
        detail += ("; every figure agrees bit for bit, so this check cannot tell the two paths apart: the engine "
                   "computes them alike, or its generate logprobs come from a prefill pass too")
    return Status.PASS, detail
