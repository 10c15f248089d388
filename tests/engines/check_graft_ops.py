#!/usr/bin/env python
"""Fails check-engine's `graft_ops` check only: it declares "graft_ops" and ignores the op
points in the graft file (layer inputs it still feeds: its `graft` check passes)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def points(self, ids, graft):
        return super().points(ids, {k: v for k, v in (graft or {}).items() if k.count(".") < 2})


Engine().run()
