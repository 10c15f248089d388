#!/usr/bin/env python
"""Fails check-engine's `max_tokens` check only: it always generates its own default of 16 tokens."""
from conformant_engine import Conformant


class Engine(Conformant):
    def max_tokens(self, req: dict) -> int:
        return 16


Engine().run()
