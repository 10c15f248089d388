#!/usr/bin/env python
"""Fails check-engine's `dump_decode` check only: its prefill dump is right, but its decode-path
dump reads its cache one position behind (each position's logits are those of the one before),
so its logits do not choose the tokens generate chose."""
from conformant_engine import Conformant


class Engine(Conformant):
    decoding = False

    def points(self, ids, graft):
        every = super().points(ids, graft)
        if self.decoding:
            every["logits"] = [every["logits"][max(0, p - 1)] for p in range(len(ids))]
        return every

    def dump(self, req):
        self.decoding = req.get("mode") == "decode"
        return super().dump(req)


Engine().run()
