#!/usr/bin/env python
"""Fails check-engine's `eos` check only: it stops on the first of the request's eos_token_ids
and not on the others (Llama 3 has three)."""
from conformant_engine import MODEL_EOS, Conformant


class Engine(Conformant):
    def eos(self, req: dict) -> set[int]:
        return set() if req.get("ignore_eos") else {(req.get("eos_token_ids") or MODEL_EOS)[0]}


Engine().run()
