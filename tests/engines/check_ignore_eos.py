#!/usr/bin/env python
"""Fails check-engine's `ignore_eos` check only: under ignore_eos it still stops at the EOS, and
reports "length" as if it had generated max_tokens."""
from conformant_engine import MODEL_EOS, Conformant


class Engine(Conformant):
    def eos(self, req: dict) -> set[int]:
        return set(req.get("eos_token_ids") or MODEL_EOS)

    def finish(self, req: dict, toks: list[int], eos: set[int]) -> str:
        return "length" if req.get("ignore_eos") else super().finish(req, toks, eos)


Engine().run()
