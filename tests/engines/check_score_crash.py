#!/usr/bin/env python
"""Fails check-engine's `score` check only (prefill_decode is then skipped): it declares score
and dies on the first score request."""
import os
import sys

from conformant_engine import Conformant


class Engine(Conformant):
    def score(self, req: dict) -> dict:
        sys.stderr.write("check_score_crash: score is not implemented yet\n")
        sys.stderr.flush()
        os._exit(134)


Engine().run()
