"""A re-scorer proves it is the recorded reference before it vouches for the candidate.

Re-scoring stands in for the reference: its gaps decide whether a flip is a near-tie and whether
each later token follows. An engine that only claims to be the reference (the candidate under
another spelling, `python -u engine.py`; the reference's server answering without the key it
needs, because a report's gate.toml reads "<redacted>") re-scores whatever it is given as it
likes, and a cascade of junk passes. Names cannot tell (rescorer_identity.py refuses only what
they can); numbers can: the engine scores a sample of the reference's OWN recorded sequences,
teacher-forced (prompt + the reference's tokens), and at every position its logprobs must agree
with the ones the reference recorded when it generated them.

The sample: up to SAMPLE_PROMPTS reference records, the diverged prompts first (the ones it is
about to vouch for), spread over them, each scored whole (one request a prompt).

The tolerance is the gate's band. Re-scored gaps are judged against the band (a gap within it is
a near-tie), so an engine whose logprobs sit further than the band from the reference's own, on
the reference's own prefix, can move a real divergence into the band; an honest engine of the
same build differs from its recording only by the prefill/decode rounding of its dtype, which
check-engine measured at up to 7e-06 nats in float32 and 0.051 in 8- to 16-bit builds
(check_engine/numerics.py), an order below the default band (0.5). At each position:
- a token both lists hold (the reference's top-k, the re-scorer's top-k and its logprob of the
  reference's token) differs by at most the band;
- a token only one list holds sits at most the band above the other list's last entry (else
  the other engine would have listed it: it ranks the vocabulary otherwise).
A mismatch is an EngineError (exit 3) naming the prompt, the position and the token.
"""

from __future__ import annotations

from collections.abc import Sequence

from strict_gate.engines.base import Engine
from strict_gate.errors import EngineError
from strict_gate.judge.compare import Comparison
from strict_gate.judge.resplit import DIVERGED
from strict_gate.runs.records import Record, Run, ScoredStep

SAMPLE_PROMPTS = 4


def sample(ref: Run, comparison: Comparison, n: int = SAMPLE_PROMPTS) -> list[Record]:
    """Up to n reference records with recorded logprobs, the diverged prompts first, spread over them."""
    diverged = [pc.id for pc in comparison.prompts if pc.status in DIVERGED]
    order = [*_spread(diverged, n), *diverged, *ref.records]
    seen: dict[str, Record] = {}
    for pid in order:
        rec = ref.records.get(pid)
        if rec is not None and pid not in seen and rec.error is None and rec.token_ids and rec.top_logprobs:
            seen[pid] = rec
        if len(seen) == n:
            break
    return list(seen.values())


def _spread(ids: Sequence[str], n: int) -> list[str]:
    """n ids evenly spaced over `ids` (all of them when there are no more than n)."""
    if len(ids) <= n:
        return list(ids)
    return [ids[i * len(ids) // n] for i in range(n)]


def prove_rescorer(engine: Engine, ref: Run, comparison: Comparison, *, band: float, k: int) -> Exception | None:
    """Refuse (EngineError, exit 3) a re-scorer whose scoring of the reference's own tokens is not
    what the reference recorded. An engine that does not start is no error here: its failure is
    returned, for diagnosis to state on every prompt without starting it again (a failed
    re-score never vouches)."""
    records = sample(ref, comparison)
    who = f"the re-scorer ({engine.kind} {engine.info().model})"
    if not records:
        raise EngineError(f"{who} cannot prove it is the recorded reference: no reference record holds "
                          "logprobs to compare its scoring with")
    try:
        with engine.scoped_env():
            engine.start()
    except Exception as e:
        return e
    for rec in records:
        try:
            with engine.scoped_env():
                steps = engine.score(rec.prompt_token_ids, rec.token_ids, k)
        except Exception as e:
            raise EngineError(f"{who} failed re-scoring the reference's own tokens of prompt {rec.id!r}, so it "
                              f"cannot vouch for the candidate: {type(e).__name__}: {e}") from None
        if (why := mismatch(rec, steps, band)) is not None:
            raise EngineError(f"{who} is not the recorded reference: re-scoring the reference's own tokens of "
                              f"prompt {rec.id!r}, {why}; a re-scorer must be the reference's engine, model and "
                              "configuration (its env secrets exported) before it judges the candidate")
    return None


def mismatch(rec: Record, steps: Sequence[ScoredStep], band: float) -> str | None:
    """Where `steps` (the reference's tokens re-scored) leave what `rec` recorded, in words; None
    when every position agrees within the band."""
    tops = rec.top_logprobs or ()
    if len(steps) < min(len(rec.token_ids), len(tops)):
        return f"it scored {len(steps)} of {len(rec.token_ids)} positions"
    for j, (token, recorded) in enumerate(zip(rec.token_ids, tops)):
        if (why := _position(token, dict(recorded), steps[j], band)) is not None:
            return f"at position {j} (token {token}) {why}"
    return None


def _position(token: int, recorded: dict[int, float], step: ScoredStep, band: float) -> str | None:
    """One position's disagreement beyond the band, in words."""
    top = {int(t): float(v) for t, v in step.top}
    scored = top if step.logprob is None or token in top else {**top, token: float(step.logprob)}
    for t in recorded.keys() & scored.keys():
        if abs(recorded[t] - scored[t]) > band:
            return (f"token {t} re-scores at {scored[t]:.4f} where the reference recorded {recorded[t]:.4f} "
                    f"(|Δ| {abs(recorded[t] - scored[t]):.4f} > band {band:g})")
    return _unlisted(scored, recorded, band, "the re-scorer ranks", "the reference's recorded") or \
        _unlisted(recorded, top, band, "the reference recorded", "the re-scorer's")


def _unlisted(a: dict[int, float], b: dict[int, float], band: float, says: str, other: str) -> str | None:
    """A token of `a` that `b` does not list though it sits more than the band above b's last entry."""
    if not b:
        return None
    floor = min(b.values())
    extra = sorted(((v, t) for t, v in a.items() if t not in b and v > floor + band), reverse=True)
    if not extra:
        return None
    v, t = extra[0]
    return (f"{says} token {t} at {v:.4f}, which {other} top-k does not list though its last entry is "
            f"{floor:.4f} (more than the band {band:g} below)")
