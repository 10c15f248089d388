#!/usr/bin/env python
"""A hostile engine for check-engine: its first process dies by SIGSEGV on its 6th request (the
determinism check's second); the processes started after it never crash (CRASH_ONCE_MARKER is
the file that says it happened). A crash costs the check it hit, not the checks after it."""
import os
import signal

from conformant_engine import Conformant


class Engine(Conformant):
    requests = 0

    def handle(self, line: str) -> None:
        self.requests += 1
        marker = os.environ["CRASH_ONCE_MARKER"]
        if self.requests == 6 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGSEGV)
        super().handle(line)


Engine().run()
