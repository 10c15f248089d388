#!/usr/bin/env python
"""Fails check-engine's `determinism` check only: a request identical to the one before hits a
stale cache entry, as if the prompt had one more token."""
import json

from conformant_engine import Conformant


class Engine(Conformant):
    last = ""

    def handle(self, line: str) -> None:
        if line == self.last:
            req = json.loads(line)
            req["prompt_token_ids"] = [*req["prompt_token_ids"], 1]
            self.send(self.answer(req))
            return
        self.last = line
        super().handle(line)


Engine().run()
