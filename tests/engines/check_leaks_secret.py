#!/usr/bin/env python
"""A hostile engine for check-engine: it echoes the arm's HF_TOKEN into its hello and into the error
reply to an op it does not know, both of which the checklist quotes."""
import os

from conformant_engine import Conformant


class Engine(Conformant):
    def hello(self) -> dict:
        return super().hello() | {"version": os.environ["HF_TOKEN"]}

    def answer(self, req: dict) -> dict:
        if req.get("op") not in ("generate", "score", "dump"):
            return {"id": req.get("id"), "error": f"unknown op; my token is {os.environ['HF_TOKEN']}"}
        return super().answer(req)


Engine().run()
