"""Process half of the openai engine: a server launched from a `serve` command.

The command runs without a shell, in its own process group (engines/process.py, shared with
the command engine), its output appended to a log file; it is polled until healthy and
stopped as a group (vLLM's engine-core and workers too): SIGTERM, `stop_timeout_s`, SIGKILL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from strict_gate.engines.openai_client import HTTPStatus, OpenAIClient, ServerExited, Unreachable
from strict_gate.engines.process import close_log, open_log, spawn, stop_group
from strict_gate.errors import EngineError

LOG_TAIL_LINES = 40
KILL_WAIT_S = 10.0  # after SIGKILL: time for the server's group to be gone (workers freeing the GPU)
HEALTH_POLL_S = 0.5


def free_ports(n: int) -> list[int]:
    """n distinct free ports on 127.0.0.1 (held open together, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ServerProcess:
    """One launched server: spawn, health wait, liveness, log tail, stop. Safe to stop twice."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, stop_timeout_s: float):
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.stop_timeout_s = stop_timeout_s
        self.log_path: str | Path | None = None
        self.startup_s: float | None = None  # seconds from launch to healthy
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._t0 = 0.0

    @property
    def pgid(self) -> int | None:
        """The process group (None before launch or once stopped)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def launch(self, shown_argv: Sequence[str]) -> None:
        """Start the command; shown_argv is what the log header prints (secrets redacted)."""
        self._log_file, path, is_temp = open_log(
            self.log_path, "strict-gate-openai-", f"# strict-gate openai: launching {list(shown_argv)}"
        )
        if is_temp:
            self.log_path = path
        try:
            self._proc = spawn(self.argv, self.env, self.cwd,
                               stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT)
        except OSError as e:
            close_log(self._log_file)
            self._log_file = None
            raise EngineError(f"openai: cannot launch {self.argv[0]!r}: {e}") from None
        self._t0 = time.monotonic()

    def check_alive(self) -> None:
        """Raise ServerExited when the launched process is gone."""
        code = self.returncode
        if self._proc is not None and code is not None:
            raise ServerExited(code)

    def wait_healthy(self, client: OpenAIClient, health_url: str | None, timeout_s: float) -> None:
        """Poll health_url (default /health, then /v1/models) until any 2xx or an auth refusal."""
        deadline = self._t0 + timeout_s
        urls = [health_url] if health_url else ["/health", "/v1/models"]
        idx = 0
        last = "no answer yet"
        while True:
            code = self.returncode
            if code is not None:
                raise EngineError(
                    f"openai: the server exited with code {code} while starting ({' '.join(self.argv)}){self.log_tail()}"
                )
            try:
                client.call("GET", urls[idx], timeout=5.0, retries=0, parse=False)  # any 2xx, any body
                break
            except HTTPStatus as e:
                last = f"{urls[idx]}: {e}"
                if e.code == 404 and idx + 1 < len(urls):
                    idx += 1
                    continue
                if e.code in (401, 403):  # it answers: it is up (auth is checked on the first request)
                    break
            except Unreachable as e:
                last = f"{urls[idx]}: {e}"
            if time.monotonic() > deadline:
                raise EngineError(
                    f"openai: the server was not healthy within startup_timeout_s = {timeout_s:g} s "
                    f"(last: {last}); stopped it{self.log_tail()}"
                )
            time.sleep(HEALTH_POLL_S)
        self.startup_s = time.monotonic() - self._t0

    def log_tail(self) -> str:
        """The last lines of the log, as a suffix for an error message ('' when there are none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                lines = f.read().decode("utf-8", errors="replace").splitlines()
        except (OSError, TypeError):
            return ""
        tail = "\n".join(lines[-LOG_TAIL_LINES:])
        return f"\n--- last lines of {self.log_path} ---\n{tail}" if tail else ""

    def stop(self) -> None:
        """Stop the whole group (SIGTERM, grace, SIGKILL) and close the log."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                stop_group(proc, proc.pid, self.stop_timeout_s, KILL_WAIT_S)
        finally:
            close_log(self._log_file)
            self._log_file = None
