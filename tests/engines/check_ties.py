#!/usr/bin/env python
"""Fails check-engine's `ties` check only: an exact tie at the argmax goes to the highest id."""
from conformant_engine import Conformant


class Engine(Conformant):
    def choose(self, lp: list[float], step: int) -> int:
        best = max(lp)
        return max(t for t in range(len(lp)) if lp[t] == best)


Engine().run()
