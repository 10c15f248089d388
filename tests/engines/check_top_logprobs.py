#!/usr/bin/env python
"""Fails check-engine's `top_logprobs` check only: an off-by-one lists k - 1 pairs a step."""
from conformant_engine import Conformant


class Engine(Conformant):
    def top(self, lp: list[float], k: int, chosen: int) -> list[list]:
        return super().top(lp, k - 1 if k > 1 else k, chosen)


Engine().run()
