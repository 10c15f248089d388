"""Virtual time for the test engines (speed_engine.py, hostile_speed_engine.py), read by the
gate through tests/virtual_clock.py: with --clock FILE an engine adds each pause to the seconds
FILE holds instead of sleeping, so a speed verdict over it is the same on an idle machine and a
loaded one. Without --clock it sleeps, as before.

Each pause is stretched by a small factor that never repeats in a cycle (+0 to +0.4 %, the
golden ratio's multiples mod 1), so that repetitions differ as real ones do (all-equal samples
are no evidence: speed/interval.py) while every ratio the tests set stays what they set.

A streamed token event is stamped by the gate when it reads it: after writing one, the engine
waits until the gate has read the clock (its reads, counted in FILE.reads), so that the stamp is
the time the event was written, never a later one the engine moved on to.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

WAIT_S = 30.0  # a gate that never reads the clock again is not waited on for ever
GOLDEN = 0.6180339887498949


class VirtualTime:
    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.pauses = 0

    def pause(self, seconds: float) -> None:
        """Sleep `seconds`, or add them (stretched a little) to the virtual clock."""
        if self.path is None:
            time.sleep(seconds)
            return
        self.pauses += 1
        now = float(self.path.read_text() or 0.0)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(repr(now + seconds * (1 + 0.004 * (self.pauses * GOLDEN % 1))))
        os.replace(tmp, self.path)

    def reads(self) -> int:
        reads = self.path.with_suffix(".reads") if self.path else None
        return int(reads.read_text() or 0) if reads is not None and reads.exists() else 0

    def stamped(self, before: int) -> None:
        """After a streamed event: wait until the gate read the clock since `before` (reads())."""
        if self.path is None:
            return
        end = time.monotonic() + WAIT_S
        while self.reads() <= before and time.monotonic() < end:
            time.sleep(0.001)
