#!/usr/bin/env python
"""Fails check-engine's `greedy` check only: at step 2 it takes the best token below the top
(a sampler left on), reporting the logprobs truthfully."""
from conformant_engine import Conformant


class Engine(Conformant):
    def choose(self, lp: list[float], step: int) -> int:
        order = self.order(lp)
        return next(t for t in order if lp[t] < lp[order[0]]) if step == 2 else order[0]


Engine().run()
