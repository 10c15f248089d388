#!/usr/bin/env python
"""Fails check-engine's `stream` check only: each token event carries the token before it (the
prompt's last id first): one event per token, the request's id, the wrong token ids."""
from conformant_engine import Conformant


class Engine(Conformant):
    def event(self, req: dict, tok: int, i: int, ids: list[int]) -> None:
        self.send({"event": "token", "id": req["id"], "token_id": self.prev if i else ids[-1]})
        self.prev = tok


Engine().run()
