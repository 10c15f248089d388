#!/usr/bin/env python
"""Passes every check, and check-engine must say its prefill_decode check was vacuous: its hello
says bfloat16, and its generate logprobs come from the same function as its score (a prefill
pass, as an adapter over a text-only engine may do: issue 26, item 12)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def hello(self) -> dict:
        return super().hello() | {"dtype": "bfloat16"}


Engine().run()
