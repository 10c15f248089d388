#!/usr/bin/env python
"""Fails check-engine's `eof` check only: EOF on stdin without a shutdown request is treated as
an error (a traceback on stderr, exit 1)."""
from conformant_engine import Conformant


class Engine(Conformant):
    def serve(self) -> None:
        self.send(self.hello())
        while True:
            line = input()  # EOFError at EOF
            if line.strip() and '"shutdown"' in line:
                return
            if line.strip():
                self.handle(line + "\n")


Engine().run()
