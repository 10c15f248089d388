"""The servers of an openai arm: where each listens, and the process of a launched one.

`arm_servers` reads the arm's shape: one `base_url`, a list of them, or `servers = N` copies
of `serve`, each with its own `{port}` and its index as `{server}`. A launched server
(`ServerProcess`) runs without a shell in its own process group (engines/process.py, shared
with the command engine), its output appended to a log file; it is polled until healthy and
stopped as a group (vLLM's engine-core and workers too): SIGTERM, `stop_timeout_s`, SIGKILL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

from strict_gate.core.engine_log import CappedLog
from strict_gate.core.model_files import NAMED_PREFIXES, resolve_model
from strict_gate.core.redact import is_secret_name
from strict_gate.engines.openai.client import HTTPStatus, OpenAIClient, ServerExited, Unreachable
from strict_gate.engines.process import close_log, log_caught_up, open_log, spawn, stop_group
from strict_gate.errors import ConfigError, EngineError

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
        self._log_file: CappedLog | None = None
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
            self._proc = spawn(self.argv, self.env, self.cwd, orphan_grace_s=self.stop_timeout_s,
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
        log_caught_up(self.pgid)
        if self.log_path is None:  # not launched
            return ""
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


class Server:
    """One server of the arm: its client, its process when launched, the prompts it answered."""

    def __init__(self, index: int, base_url: str, port: int | None, client: OpenAIClient,
                 process: ServerProcess | None, health_url: str | None):
        self.index = index
        self.base_url = base_url
        self.port = port
        self.client = client
        self.process = process
        self.health_url = health_url
        self.served: list[str] = []
        self.failed = False

    @property
    def name(self) -> str:
        return f"server {self.index} ({self.base_url})"


def served_context(client: OpenAIClient, model: str | None) -> int | None:
    """The context a server states for `model` (vLLM's /v1/models max_model_len), or None."""
    try:
        models = client.call("GET", "/v1/models", timeout=10.0, retries=0)
    except (HTTPStatus, Unreachable):
        return None
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            ctx = entry.get("max_model_len")
            return ctx if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0 else None
    return None


def url_problem(url: str, name: str = "base_url") -> str | None:
    """Why a URL option is refused, None when it is fine. Credentials in it (user:key@host,
    ?api_key=...) would be written to the manifest, every report, the gate.toml copy and the
    console. base_url takes no query at all (paths are appended to it); health_url keeps a
    query whose names do not look secret (core/redact.py's rule)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if "@" in parts.netloc:
        what = "user:password@ credentials"
    elif name == "base_url" and ("?" in url or "#" in url):
        what = "a query or fragment (?... / #...), where keys such as ?api_key= go"
    elif any(is_secret_name(k) for k, _ in query):
        what = "a secret-looking query parameter"
    else:
        return None
    shown = urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    return (f"openai: {name} {shown!r} carries {what}; it would be written to the manifest, the reports "
            f"and the console. Give {name} without it, put the key in an environment variable and name "
            "that variable with api_key_env = \"NAME\" (sent as Authorization: Bearer)")


def url_problems(o) -> list[tuple[str, str]]:
    """(option name, why refused) for each URL option of `o` that carries credentials."""
    urls = [("base_url", u) for u in (o.base_url if isinstance(o.base_url, list) else [o.base_url])]
    urls.append(("health_url", o.health_url))
    return [(name, why) for name, u in urls if isinstance(u, str) and (why := url_problem(u, name))]


def _check_shape(o) -> None:
    """How the options combine; each option's own type and range OpenAIOptions checks itself."""
    for _, problem in url_problems(o):
        raise ConfigError(problem)
    urls = o.base_url if isinstance(o.base_url, list) else None
    if not o.base_url and not o.serve:
        raise ConfigError("openai: set base_url (a running server) or serve (a command that launches one)")
    if o.servers > 1 and not o.serve:
        raise ConfigError("openai: servers = N (>= 1) is the number of copies of serve to launch; "
                          "for several running servers give base_url as a list")
    if urls is not None and (o.serve or not urls):
        raise ConfigError("openai: base_url as a list names running servers (connect mode): "
                          "give it without serve, with at least one URL; to launch several use servers = N")
    if o.servers > 1 and not any("{port}" in a for a in o.serve):
        raise ConfigError("openai: with servers > 1 put {port} in serve, so each copy listens on its own port")


def arm_servers(o, env: Mapping[str, str], base_dir: Path) -> list[Server]:
    """The servers named by an arm's OpenAIOptions `o` (nothing launched yet); ConfigError for a
    shape that cannot work."""
    _check_shape(o)
    urls = o.base_url if isinstance(o.base_url, list) else [o.base_url] * o.servers
    templates = [*(u or "" for u in urls), o.health_url or "", *(o.serve or [])]
    ports = free_ports(len(urls)) if any("{port}" in t for t in templates) else [None] * len(urls)
    return [_server(o, env, base_dir, i, port, url) for i, (port, url) in enumerate(zip(ports, urls))]


def _server(o, env: Mapping[str, str], base_dir: Path, i: int, port: int | None, base_template: str | None) -> Server:
    def sub(s: str) -> str:
        s = s.replace("{server}", str(i))
        return s.replace("{port}", str(port)) if port is not None else s

    if base_template:
        base = sub(base_template).rstrip("/")
    elif port is not None:
        base = f"http://127.0.0.1:{port}"
    else:
        raise ConfigError(
            "openai: with serve and no base_url, put {port} in the serve command "
            "(e.g. \"--port\", \"{port}\") so the engine knows where the server listens"
        )
    base = base.removesuffix("/v1")
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"openai: base_url {base_template!r} must start with http:// or https://")
    process = None
    if o.serve:
        argv = [resolve_model(a, base_dir) if a.startswith(NAMED_PREFIXES) else a for a in map(sub, o.serve)]
        process = ServerProcess(argv, {k: sub(str(v)) for k, v in env.items()}, str(base_dir), o.stop_timeout_s)
    client = OpenAIClient(base, o.api_key_env, o.request_timeout_s, o.retries,
                          alive=process.check_alive if process else None)
    return Server(i, base, port, client, process, sub(o.health_url) if o.health_url else None)
