#!/usr/bin/env python
"""A hostile engine for check-engine: says hello, then never answers a generate request."""
import time

from conformant_engine import Conformant


class Engine(Conformant):
    def generate(self, req: dict) -> dict:
        time.sleep(600)
        return super().generate(req)


Engine().run()
