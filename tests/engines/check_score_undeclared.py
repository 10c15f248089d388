#!/usr/bin/env python
"""Fails check-engine's `score` check only: it answers score requests but its hello does not
declare "score", so no gate ever sends it one."""
from typing import ClassVar

from conformant_engine import Conformant


class Engine(Conformant):
    capabilities: ClassVar[list[str]] = ["generate", "stream", "dump", "graft", "graft_ops", "dump_decode", "prefill_chunk"]

    def answer(self, req: dict) -> dict:
        return self.score(req) if req.get("op") == "score" else super().answer(req)


Engine().run()
