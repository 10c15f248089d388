#!/usr/bin/env python
"""Fails check-engine's `hello` check only: facts of the wrong type, which a gate silently ignores
(a wrong `max_context` the gate itself refuses at start, so it is not the one planted here)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def hello(self) -> dict:
        return super().hello() | {"eager": "yes", "kv_cache": 4096}


Engine().run()
