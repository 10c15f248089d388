#!/usr/bin/env python
"""Fails check-engine's `prefill_decode` check only: its score op gives each step the right
logprob for the chosen token, but the `top` list of the next position (issue 26, item 11)."""
from itertools import pairwise

from conformant_engine import Conformant


class Engine(Conformant):
    def score(self, req: dict) -> dict:
        out = super().score(req)
        steps = out["steps"]
        for a, b in pairwise(steps):
            a["top"] = b["top"]
        return out


Engine().run()
