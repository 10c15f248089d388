"""Where K runs of one engine on the same prompts split: a baseline's determinism (capture), a
merged shard run's (recomputed over every shard's records)."""

from __future__ import annotations

from collections.abc import Sequence

from strict_gate.runs.records import Record


def determinism_summary(records: Sequence[Record]) -> dict:
    """Across the K captured runs: how many prompts repeat exactly, and where the others split."""
    per_prompt = []
    k = 0
    for rec in records:
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
    total = len(records)
    return {
        "runs": k,
        "prompts_total": total,
        "prompts_deterministic": total - len(per_prompt),
        "non_deterministic": per_prompt,
    }
