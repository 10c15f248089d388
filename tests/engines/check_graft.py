#!/usr/bin/env python
"""Fails check-engine's `graft` check only: it declares "graft" and ignores the graft file."""
from conformant_engine import Conformant


class Engine(Conformant):
    def points(self, ids, graft):
        return super().points(ids, None)


Engine().run()
