#!/usr/bin/env python
"""Fails check-engine's `unknown_op` check only: an op it does not know makes it exit."""
import sys

from conformant_engine import Conformant


class Engine(Conformant):
    def answer(self, req: dict) -> dict:
        if req.get("op") not in ("generate", "score", "dump"):
            sys.exit(f"check_unknown_op: unknown op {req.get('op')!r}")
        return super().answer(req)


Engine().run()
