"""A watchdog for `strict-gate bisect`: the user's repository is restored however bisect ends,
a SIGKILL included.

Every step (both ends, then `git bisect run`) runs in a process group of its own, so that
Ctrl-C stops a step as one. A SIGKILL of `strict-gate bisect` cannot be caught: the group would
go on checking out commits in the user's repository and running the build and the gate. The
watchdog is a process in its own session holding the only read end of a pipe that bisect
writes: bisect names each group it starts and says "done" once it has restored the repository
itself. End of file without "done" means bisect died: the watchdog stops the groups it was
told of, then ends the bisection (`git bisect reset`) or checks out the original HEAD.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

GRACE_S = 5.0  # from SIGTERM to SIGKILL of a step's group
DONE, GROUP = "done", "group"


class Watchdog:
    """The bisect side: start the watchdog, tell it each step group, say done at the end."""

    def __init__(self, repo: Path, original: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "strict_gate.nightly.bisect_watch", str(repo), original],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)

    def group(self, pgid: int) -> None:
        self._say(f"{GROUP} {pgid}")

    def done(self) -> None:
        """The repository is restored: the watchdog leaves without touching anything."""
        self._say(DONE)
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _say(self, line: str) -> None:
        try:
            self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass  # the watchdog is gone: nothing more to tell it


def stop_group(pgid: int) -> None:
    """SIGTERM the group, SIGKILL what is left after GRACE_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def restore(repo: Path, original: str) -> None:
    """End a bisection left behind, else go back to the original HEAD (a branch or a sha)."""
    git_path = subprocess.run(["git", "rev-parse", "--git-path", "BISECT_START"], cwd=repo, capture_output=True,
                              text=True).stdout.strip()
    if git_path and (repo / git_path).exists():
        subprocess.run(["git", "bisect", "reset"], cwd=repo, capture_output=True)
    else:
        subprocess.run(["git", "checkout", "-q", original], cwd=repo, capture_output=True)


def watch(repo: Path, original: str, lines: Iterable[str]) -> bool:
    """Read bisect's lines to the end; True when it said done, else stop its groups and restore."""
    groups: list[int] = []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        if word == DONE:
            return True
        if word == GROUP and rest.isdigit():
            groups.append(int(rest))
    for pgid in groups:
        stop_group(pgid)
    restore(repo, original)
    return False


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is bisect's to handle; we wait for its word
    watch(Path(sys.argv[1]), sys.argv[2], sys.stdin)
