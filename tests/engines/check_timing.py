#!/usr/bin/env python
"""Fails check-engine's `timing` check only: it reports milliseconds in the seconds fields."""
from conformant_engine import Conformant


class Engine(Conformant):
    def timing(self, ttft: float, total: float) -> dict:
        return {"ttft_s": ttft * 1000, "total_s": total * 1000}


Engine().run()
