#!/usr/bin/env python
"""Fails check-engine's `malformed` check only: a request it cannot read kills it (no per-request
error reply)."""
import json

from conformant_engine import Conformant


class Engine(Conformant):
    def handle(self, line: str) -> None:
        req = json.loads(line)
        if req.get("op") == "generate" and not isinstance(req.get("prompt_token_ids"), list):
            raise TypeError("prompt_token_ids is not a list")
        super().handle(line)


Engine().run()
