"""A text-only candidate's text split into tokens the way the reference itself would.

A text-only reply's ids are its text tokenized in context, and a model's greedy output is not
always the tokenizer's split of the same text (three single-space tokens where the tokenizer
makes one double space and one single). Re-scored on that split, the reference ranks the
tokenizer's piece far below its own choice although the text is the same: a false divergence
with a gap of many nats. So before a diverged text-only prompt is re-scored, its text is walked
again from the first differing token: at each position the reference (teacher forcing on the
walk so far) names its top-k, and the highest-ranked token whose bytes continue the reply's
bytes is taken (its argmax where that fits: the reference would have chosen it). Where none of
its top-k continues them, the text really differs there: the rest keeps the in-context split
when it lines up with the walk, and the prompt keeps its in-context ids when it does not.
Bytes, not decoded text: a half character decodes to U+FFFD whatever bytes it holds (0xF0 and
0xEF 0xBF both read " 👌�" after an emoji), so a walk by text took the reference's 0xF0 for the
server's U+FFFD and judged bytes the server never sent. A split is accepted only where it
spells the reply's bytes exactly. The walk changes ids, never bytes; it costs one scoring
request per position walked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from strict_gate.judge.compare import Comparison, PromptComparison, Status, compare_prompt, with_prompts
from strict_gate.judge.text_only import Decode, Spell
from strict_gate.runs.records import Record, ScoredStep

Score = Callable[[Sequence[int], Sequence[int], int], list[ScoredStep]]
DIVERGED = (Status.DIVERGENT, Status.NEAR_TIE, Status.LENGTH_MISMATCH)


def _walk(rec: Record, start: int, score: Score, k: int, spell: Spell) -> tuple[int, ...] | None:
    """The reply's ids as the reference splits them from `start`, or None when that cannot be
    lined up with the reply's bytes (the bytes of its in-context ids: its text, tokenized)."""
    reply, prompt = spell(rec.token_ids), rec.prompt_token_ids
    ids = list(rec.token_ids[:start])
    done = spell(ids)
    limit = 4 * max(len(rec.token_ids), 1) + 4
    while len(done) < len(reply) and len(ids) < limit:
        probe = rec.token_ids[len(ids)] if len(ids) < len(rec.token_ids) else rec.token_ids[-1]
        top = score(prompt, [*ids, probe], k)[-1].top
        rest = reply[len(done):]
        fits = next((t for t, _ in top if (s := spell([t])) and rest.startswith(s)), None)
        if fits is None:
            return _rest_in_context(rec, ids, done, spell)
        ids.append(fits)
        done += spell([fits])
    return tuple(ids) if done == reply else None


def _rest_in_context(rec: Record, ids: list[int], done: bytes, spell: Spell) -> tuple[int, ...] | None:
    """The walk so far, then the in-context ids from the boundary where their bytes are `done`."""
    for j in range(len(rec.token_ids) + 1):
        head = spell(rec.token_ids[:j])
        if head == done:
            return (*ids, *rec.token_ids[j:])
        if len(head) > len(done):
            return None
    return None


def resplit(comparison: Comparison, reference: Mapping[str, Record], candidate: Mapping[str, Record],
            score: Score, k: int, decode: Decode, spell: Spell, *, band: float, greedy_tolerance: float
            ) -> tuple[Comparison, Mapping[str, Record], int]:
    """Each diverged text-only prompt walked again along the reference's splits (`spell`: the
    bytes ids stand for) and compared again (`decode`: the text, for text-level matches): (the
    comparison, the candidate's records with the walked ids over the stored ones, how many
    prompts changed)."""
    walked: dict[str, Record] = {}
    prompts: list[PromptComparison] = []
    for pc in comparison.prompts:
        cand = candidate.get(pc.id)
        if pc.status not in DIVERGED or cand is None or cand.text_only is None or pc.first_divergence is None:
            continue
        ids = _walk(cand, pc.first_divergence.position, score, k, spell)
        if ids is None or ids == tuple(cand.token_ids):
            continue
        walked[pc.id] = replace(cand, token_ids=ids)
        prompts.append(compare_prompt(pc.id, reference[pc.id], walked[pc.id], band, greedy_tolerance, decode))
    if not walked:
        return comparison, candidate, 0
    return with_prompts(comparison, prompts), Overlay(walked, candidate), len(walked)


class Overlay(Mapping[str, Record]):
    """A run's records with some replaced (a run read on demand stays on demand)."""

    def __init__(self, top: Mapping[str, Record], base: Mapping[str, Record]):
        self.top, self.base = top, base

    def __getitem__(self, key: str) -> Record:
        return self.top[key] if key in self.top else self.base[key]

    def __iter__(self):
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)
