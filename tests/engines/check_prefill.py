#!/usr/bin/env python
"""Fails check-engine's `prefill_decode` check only: its prompt path computes 0.05 nats below its
decode path (an engine finding, not a protocol error)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def score(self, req: dict) -> dict:
        out = super().score(req)
        for step in out["steps"]:
            step["logprob"] -= 0.05
            step["top"] = [[t, lp - 0.05] for t, lp in step["top"]]
        return out


Engine().run()
