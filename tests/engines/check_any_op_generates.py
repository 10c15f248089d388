#!/usr/bin/env python
"""A hostile engine for check-engine: every op but score is served as a generate, so an op it does
not know gets a record instead of an error reply, and a gate could never tell."""
from conformant_engine import Conformant


class Engine(Conformant):
    def answer(self, req: dict) -> dict:
        if req.get("op") not in ("generate", "score", "dump"):
            req = {**req, "prompt_token_ids": [1, 2, 3], "max_tokens": 4, "top_logprobs": 1}
            return self.generate(req)
        return super().answer(req)


Engine().run()
