#!/usr/bin/env python
"""Fails check-engine's `graft` check only: it declares "graft" and ignores the layer inputs in
the graft file (op points it still feeds: its `graft_ops` check passes)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def points(self, ids, graft):
        return super().points(ids, {k: v for k, v in (graft or {}).items() if k != "embed"})


Engine().run()
