#!/usr/bin/env python
"""Fails check-engine's `hello` check only: facts of the wrong type, which a gate silently ignores."""
from conformant_engine import Conformant


class Engine(Conformant):
    def hello(self) -> dict:
        return super().hello() | {"eager": "yes", "max_context": "4096"}


Engine().run()
