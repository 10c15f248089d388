#!/usr/bin/env python
"""Fails check-engine's `prefill_chunk` check only: given a prefill_chunk shorter than the
prompt, its third token is the runner-up (a chunked prefill that computes another thing)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def generate(self, req):
        chunk = req.get("prefill_chunk")
        self.chunked = bool(chunk) and chunk < len(req["prompt_token_ids"])
        return super().generate(req)

    def choose(self, lp, step):
        return self.order(lp)[2] if step == 2 and self.chunked else super().choose(lp, step)

    chunked = False


Engine().run()
