"""One HTTP request of the openai engine: a deadline on the whole request, and no redirects.

- A socket timeout bounds each read, not the request: a server trickling one byte every 0.1 s
  would hold a request for ever. A `Deadline` timer shuts the connection's socket down when
  the request's time is up, which ends whatever read is blocked (connect, headers, body, a
  whole stream), and the caller reports the deadline, not the broken read it caused.
- A redirect is refused, never followed: urllib would send the `Authorization: Bearer` header
  to whatever origin the `Location` names, and turn a POST into a GET. The engine failure names
  the Location, so that base_url can point at the real server.

Only the standard library (urllib, http.client); proxies from the environment still apply.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from strict_gate.errors import EngineError


class Redirected(EngineError):
    """The server answered a redirect, which the engine does not follow."""


class Deadline:
    """A time limit on one whole request: at expiry every socket it watches is shut down."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._end = time.monotonic() + seconds
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def message(self) -> str:
        return f"no complete answer within {self.seconds:g} s (a deadline on the whole request, not on each read)"

    def remaining(self) -> float:
        """Seconds left, as a socket timeout (never 0, which would mean non-blocking)."""
        return max(0.001, self._end - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            if self.expired:
                _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                _shutdown(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shutdown(sock: socket.socket) -> None:
    """Wake a read blocked on sock. The plain socket's shutdown, also for a TLS socket, whose own
    shutdown would unwrap it under the reading thread."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, ValueError):  # already closed
        pass


def _watching(http_class: Callable[..., http.client.HTTPConnection], deadline: Deadline):
    """A connection factory for urllib whose connections put their socket under `deadline`."""

    def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        conn = http_class(*args, **kwargs)
        connect = conn.connect

        def connect_watched() -> None:
            connect()
            if conn.sock is not None:
                deadline.watch(conn.sock)

        conn.connect = connect_watched  # type: ignore[method-assign]
        return conn

    return make


class _Watched:
    def __init__(self, deadline: Deadline):
        super().__init__()
        self.deadline = deadline

    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_watching(http_class, self.deadline), req, **kwargs)  # type: ignore[misc]


class _HTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _HTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        fp.close()
        raise Redirected(
            f"openai: {req.get_method()} {req.full_url} answered HTTP {code}, a redirect to {newurl!r}; "
            "redirects are not followed (that would send the API key to the address it names, and turn "
            "a POST into a GET): set base_url to the server's own address"
        )


def open_request(request: urllib.request.Request, deadline: Deadline):
    """Send `request` under `deadline`; urllib's response, or urllib's errors (HTTPError for a
    non-2xx answer), or Redirected."""
    opener = urllib.request.build_opener(_NoRedirect, _HTTP(deadline), _HTTPS(deadline))
    return opener.open(request, timeout=deadline.remaining())


class OpenStream:
    """A streamed answer and its deadline: iterate its lines, then close it (the deadline runs
    until then)."""

    def __init__(self, resp, deadline: Deadline):
        self.resp = resp
        self.deadline = deadline

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.resp)

    def __enter__(self) -> OpenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.deadline.cancel()
        self.resp.close()
