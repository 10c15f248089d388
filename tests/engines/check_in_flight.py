#!/usr/bin/env python
"""Fails check-engine's `in_flight` check only: it declares max_in_flight 4, and when requests
arrive together (more than one line waiting when it reads), the third token of each is the
runner-up (tokens that move when two requests arrive together)."""
import json
import os
import select

from conformant_engine import Conformant


class Engine(Conformant):
    together = False

    def choose(self, lp, step):
        return self.order(lp)[2] if step == 2 and self.together else super().choose(lp, step)

    def serve(self):
        self.send(self.hello())
        buf = b""
        while True:
            while b"\n" not in buf or select.select([0], [], [], 0.1)[0]:
                chunk = os.read(0, 65536)
                if not chunk:
                    return self.on_eof()
                buf += chunk
            lines = buf.split(b"\n")
            buf = lines.pop()
            self.together = len(lines) > 1
            for line in lines:
                if line.strip() and json.loads(line).get("op") == "shutdown":
                    return self.on_eof()
                if line.strip():
                    self.handle(line.decode() + "\n")


Engine().run()
