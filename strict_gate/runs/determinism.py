"""Where K runs of one engine on the same prompts split: a baseline's determinism (capture), a
merged shard run's (recomputed over every shard's records)."""

from __future__ import annotations

from collections.abc import Iterable

from strict_gate.runs.records import Record


def determinism_summary(records: Iterable[Record]) -> dict:
    """Across the K captured runs: how many prompts repeat exactly, and where the others split.
    One record at a time: a run read from disk makes each record when it is looked up."""
    per_prompt = []
    k = total = 0
    for rec in records:
        total += 1
        samples = rec.samples or ()
        k = max(k, len(samples))
        if len(samples) < 2 or all(s == samples[0] for s in samples[1:]):
            continue
        width = max(len(s) for s in samples)
        positions = []
        for i in range(width):
            seen = sorted({s[i] if i < len(s) else -1 for s in samples})
            if len(seen) > 1:
                positions.append({"position": i, "tokens": [t for t in seen if t >= 0], "ended": -1 in seen})
        distinct = len({tuple(s) for s in samples})
        per_prompt.append({"id": rec.id, "distinct_sequences": distinct, "positions": positions})
    return {
        "runs": k,
        "prompts_total": total,
        "prompts_deterministic": total - len(per_prompt),
        "non_deterministic": per_prompt,
    }
