"""An in-process engine another package registers with strict-gate (docs/engine-plugins.md).

The model is a toy (a byte vocabulary, logits from the sum of the ids) so that this file runs as
it is; replace `_logits` with your model's forward pass and `tokenize` with its tokenizer. Register
it from your package's pyproject.toml:

    [project.entry-points."strict_gate.engines"]
    toy = "plugin_engine:ToyEngine"

and a gate arm may then say `kind = "toy"`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from strict_gate.core.options import Checked
from strict_gate.engines import Engine, PromptInput, ScoredStep
from strict_gate.engines.base import greedy_finish_reason
from strict_gate.runs.records import EngineInfo, Record, Sampling

VOCAB = 256


@dataclass(frozen=True)
class ToyOptions(Checked):
    seed: int = 7  # the arm's table keys other than kind/env/runs land here, type-checked


def _logprobs(ids: Sequence[int], seed: int) -> list[float]:
    logits = [float((sum(ids) * seed + t * 13) % 17) / 4 for t in range(VOCAB)]
    m = max(logits)
    lse = m + math.log(sum(math.exp(v - m) for v in logits))
    return [v - lse for v in logits]


def _top(lp: list[float], k: int) -> tuple[tuple[int, float], ...]:
    return tuple(sorted(enumerate(lp), key=lambda p: (-p[1], p[0]))[:k])


class ToyEngine(Engine):
    kind = "toy"
    Options = ToyOptions
    can_score = True

    def info(self) -> EngineInfo:
        return EngineInfo(kind=self.kind, model="toy-bytes", options={"seed": self.options.seed})

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        for p in prompts:
            ids, tops = list(p.token_ids), []
            for _ in range(sampling.max_tokens):
                top = _top(_logprobs(ids, self.options.seed), sampling.top_logprobs)
                tops.append(top)
                ids.append(top[0][0])
            out = tuple(ids[len(p.token_ids):])
            yield Record(id=p.id, prompt_token_ids=p.token_ids, token_ids=out, top_logprobs=tuple(tops),
                         finish_reason=greedy_finish_reason(out, set()))

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        ids, steps = list(prompt_ids), []
        for t in continuation_ids:
            lp = _logprobs(ids, self.options.seed)
            steps.append(ScoredStep(token_id=t, logprob=lp[t], top=_top(lp, k)))
            ids.append(t)
        return steps
