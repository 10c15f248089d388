"""The speed measurement's clock made virtual (strict_gate/speed/measure.py's `clock`): it reads
the seconds the test engines add to a file instead of sleeping (tests/engines/virtual_time.py),
so that a test's speed verdict is the same however loaded the machine is.

    def test_x(virtual_clock):  # the fixture (conftest.py): the file, the clock already in place
        arm = command_arm(..., "--clock", str(virtual_clock))
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class VirtualClock:
    """Reads the engines' virtual seconds; counts its readings in FILE.reads (a streaming engine
    waits on them, virtual_time.py)."""

    def __init__(self, path: Path):
        self.path, self.reads = path, 0
        self.lock = threading.Lock()
        path.write_text("0.0")

    def __call__(self) -> float:
        with self.lock:
            now = float(self.path.read_text() or 0.0)
            self.reads += 1
            tmp = self.path.with_suffix(".reads-tmp")
            tmp.write_text(str(self.reads))
            os.replace(tmp, self.path.with_suffix(".reads"))
            return now


@contextmanager
def virtual_time(path: Path) -> Iterator[Path]:
    """The measurement reads the virtual clock at `path` while inside (a module-scoped fixture's
    way; a test's is the `virtual_clock` fixture)."""
    from strict_gate.speed import measure

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure, "clock", VirtualClock(path))
        yield path
