"""Every process an engine started, wherever it went: found by a tag in its environment.

Stopping an engine's process group (engines/process.py) misses a helper that left the group: one
started in a session of its own (setsid, start_new_session), or a daemon that double-forked
into one. Each engine process gets `TAG_VAR` = a fresh tag in its environment, which every
process it starts inherits whatever group or session it moves to; a stop signals the group and
every live process whose /proc/PID/environ holds the tag, the gate's watchdog likewise once the
gate is gone (SIGKILL, the OOM killer).

What this cannot find, said plainly: a helper that clears or replaces its environment before it
runs (`env -i`, execve with an environment of its own), a process of another user (its environ
is not ours to read), and anything at all without /proc (macOS). A zombie holds no environment:
it is gone for this purpose, as for group_alive.
"""

from __future__ import annotations

import os
import uuid

TAG_VAR = "STRICT_GATE_ENGINE_TAG"


def marker(tag: str) -> str:
    """The environment entry a tagged process carries (the watchdog's last argument)."""
    return f"{TAG_VAR}={tag}"


def new_tag() -> str:
    """A tag no other engine process of any gate carries."""
    return uuid.uuid4().hex


def tagged(tag: str) -> list[int]:
    """The pids of the live processes whose environment holds TAG_VAR=tag (this process excluded)."""
    want = marker(tag).encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me, out = os.getpid(), []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if want in env.split(b"\0"):
            out.append(int(entry))
    return out


def signal_tagged(tag: str, sig: int) -> bool:
    """Send sig to every process carrying the tag; whether any was found."""
    pids = tagged(tag)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # it exited since the scan
            pass
    return bool(pids)


# The watchdog: argv gate-pid pgid grace TAG_VAR=tag. While the gate is its parent it waits (and ends when
# the group and every tagged process are gone); once the gate is gone it stops them: SIGTERM,
# `grace` s, SIGKILL. Self-contained (run with -I -S): it repeats tagged() above.
WATCHDOG = """
import os, signal, sys, time
gate, pgid, grace, want = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].encode()
def group():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
def tagged():
    out = []
    for e in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if e.isdigit() and int(e) != os.getpid():
            try:
                with open("/proc/" + e + "/environ", "rb") as f:
                    if want in f.read().split(b"\\0"):
                        out.append(int(e))
            except OSError:
                pass
    return out
def kill(sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass
    for pid in tagged():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
while os.getppid() == gate:
    if not group():
        if not tagged():
            sys.exit(0)
        time.sleep(1.0)
    time.sleep(0.2)
kill(signal.SIGTERM)
end = time.monotonic() + grace
while (group() or tagged()) and time.monotonic() < end:
    time.sleep(0.1)
kill(signal.SIGKILL)
"""
