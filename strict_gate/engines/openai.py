"""An OpenAI-compatible completions server (vLLM's `api_server`, or any server that speaks it).

Token ids in, token ids out: the prompt is sent as a list of ids to `/v1/completions` and the
generated tokens come back as ids (`return_tokens_as_token_ids`, vLLM's `"token_id:123"` form,
and `return_token_ids`). A server that can only answer with text is refused: comparing
re-tokenized text would hide exactly the differences this tool exists to find.

Two modes:
- connect: `base_url` names a server that is already running; nothing is launched.
- launch: `serve` is a command (no shell) that starts the server. It runs in its own process
  group with its output in a log file, is polled until healthy, and is stopped (the whole
  group: vLLM's engine-core and workers too) by close(), at exit and on Ctrl-C. `{port}` in
  `serve`, `base_url` or `health_url` is replaced by a free port on 127.0.0.1.

Teacher-forced scoring uses `prompt_logprobs` (vLLM): prompt + continuation is sent with
`max_tokens: 1`, and entry i of the returned `prompt_logprobs` scores token i given 0..i-1.

Only the standard library is used for HTTP (urllib), so the core stays light. The API key is
read from the environment variable named by `api_key_env` and is never written anywhere.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from http.client import HTTPException
from pathlib import Path

from strict_gate.engines.base import (
    BUNDLED_PREFIX,
    Engine,
    PromptInput,
    ScoredStep,
    find_tokenizer_json,
    resolve_model,
)
from strict_gate.engines.process import close_log, open_log, spawn, stop_group
from strict_gate.errors import ConfigError, EngineError
from strict_gate.records import EngineInfo, Record, Sampling, Timing, sort_topk
from strict_gate.redact import register, scrub_json

TOKEN_ID_PREFIX = "token_id:"
# Sent with every completion so that the server's greedy choice is the raw argmax, whatever
# defaults the model's generation_config carries (vLLM's server applies them to requests).
NEUTRAL = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
LOG_TAIL_LINES = 40
KILL_WAIT_S = 10.0  # after SIGKILL: time for the server's group to be gone (workers freeing the GPU)


@dataclass(frozen=True)
class OpenAIOptions:
    base_url: str | None = None  # http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str | None = None  # the served model name; None: the first of GET /v1/models
    api_key_env: str | None = None  # NAME of the env var that holds the key (never the key)
    serve: list[str] | None = None  # command that launches the server (argv, no shell)
    health_url: str | None = None  # default: base_url/health, then base_url/v1/models
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 120.0
    retries: int = 2  # extra attempts after a connection error or a 5xx (never after a 4xx)
    tokenizer: str | None = None  # tokenizer.json or a model dir; None: the server's /tokenize
    prompt_logprobs: bool = True  # teacher-forced scoring through prompt_logprobs
    stream_timing: bool = False  # stream each request to measure time to first token
    # Merged into every completion request over the neutral settings (top_p 1, presence and
    # frequency penalties 0, repetition_penalty 1: vLLM's server otherwise takes defaults such as
    # a repetition penalty from the model's generation_config). A key set to null is not sent.
    extra_body: dict = field(default_factory=dict)
    stop_timeout_s: float = 30.0  # SIGTERM grace period before SIGKILL


class _HTTPStatus(Exception):
    """A non-2xx answer that is not retried (4xx) or that outlived its retries (5xx)."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        super().__init__(f"HTTP {code}: {message}")


class _Unreachable(Exception):
    """No answer at all: connection refused/reset, server gone, or a timeout."""


def _server_message(body: bytes) -> str:
    """The error text of an OpenAI-style error body, else the body itself (shortened)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
        if obj.get("message"):
            return str(obj["message"])[:500]
    return text[:500]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _token_id(s: object) -> int | None:
    """123 from "token_id:123"; None for a token that came back as text."""
    if isinstance(s, str) and s.startswith(TOKEN_ID_PREFIX):
        try:
            return int(s[len(TOKEN_ID_PREFIX):])
        except ValueError:
            return None
    return None


def _logprob(v: object) -> float:
    lp = float(v)  # json reads -Infinity as -inf; vLLM clamps to -9999.0
    if math.isnan(lp):
        raise ValueError("NaN logprob")
    return lp


class OpenAIEngine(Engine):
    kind = "openai"
    Options = OpenAIOptions
    can_score = True
    in_process = False

    def __init__(self, options: OpenAIOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        if not options.base_url and not options.serve:
            raise ConfigError("openai: set base_url (a running server) or serve (a command that launches one)")
        if options.serve is not None and (not options.serve or not all(isinstance(a, str) for a in options.serve)):
            raise ConfigError("openai: serve must be a non-empty list of strings (argv, no shell)")
        if options.retries < 0 or options.retries > 10:
            raise ConfigError("openai: retries must be between 0 and 10")
        for name in ("startup_timeout_s", "request_timeout_s", "stop_timeout_s"):
            if getattr(options, name) <= 0:
                raise ConfigError(f"openai: {name} must be > 0")
        if not options.prompt_logprobs:
            self.can_score = False
        port = None
        texts = [options.base_url or "", options.health_url or "", *(options.serve or [])]
        if any("{port}" in t for t in texts):
            port = _free_port()
        self.port = port

        def sub(s: str) -> str:
            return s.replace("{port}", str(port)) if port is not None else s

        if options.base_url:
            base = sub(options.base_url).rstrip("/")
        elif port is not None:
            base = f"http://127.0.0.1:{port}"
        else:
            raise ConfigError(
                "openai: with serve and no base_url, put {port} in the serve command "
                "(e.g. \"--port\", \"{port}\") so the engine knows where the server listens"
            )
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        if not base.startswith(("http://", "https://")):
            raise ConfigError(f"openai: base_url {options.base_url!r} must start with http:// or https://")
        self.base_url = base
        self.health_url = sub(options.health_url) if options.health_url else None
        self.serve_cmd = [self._resolve_arg(sub(a)) for a in options.serve] if options.serve else None
        self.log_path: str | Path | None = None  # the gate sets this (in the run dir) before start()
        self._model: str | None = options.model
        self._versions: dict | None = None
        self._proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._log_file = None
        self._started = False
        self._atexit_registered = False
        self.startup_s: float | None = None  # launch mode: seconds from launch to healthy
        self._tok = None
        self._tokenizer_path = self._resolve_tokenizer(options.tokenizer) if options.tokenizer else None
        register(self._api_key)

    # ---------------------------------------------------------------- paths
    def _resolve_arg(self, arg: str) -> str:
        """`bundled:NAME` in the serve command -> the bundled model's directory."""
        if arg.startswith(BUNDLED_PREFIX):
            return resolve_model(arg, self.base_dir)
        return arg

    def _resolve_tokenizer(self, spec: str) -> str:
        path = find_tokenizer_json(spec, self.base_dir)
        if path is None:
            raise ConfigError(
                f"openai: tokenizer {spec!r}: no tokenizer.json there "
                "(give a tokenizer.json file or a model directory that has one)"
            )
        return str(path)

    # ---------------------------------------------------------------- HTTP
    @property
    def _api_key(self) -> str | None:
        """Read at each use from the variable named by api_key_env; never stored in options, and
        registered so that whatever the gate writes (an error echoing it) is scrubbed."""
        key = os.environ.get(self.options.api_key_env) or None if self.options.api_key_env else None
        register(key)
        return key

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def _open(self, method: str, path: str, body: dict | None, timeout: float):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self._url(path), data=data, method=method, headers=self._headers())
        return urllib.request.urlopen(req, timeout=timeout)

    def _call(self, method: str, path: str, body: dict | None = None, *, timeout: float | None = None,
              retries: int | None = None, stream: bool = False, parse: bool = True):
        """One request with bounded retries (connection errors and 5xx only, with backoff).

        Returns the parsed JSON (the raw body when parse=False, the open response when
        stream=True). Raises _HTTPStatus for a 4xx (or a 5xx after the retries) and
        _Unreachable when no answer came.
        """
        timeout = self.options.request_timeout_s if timeout is None else timeout
        retries = self.options.retries if retries is None else retries
        last: Exception | None = None
        for attempt in range(retries + 1):
            if attempt:
                self._check_alive()
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            try:
                resp = self._open(method, path, body, timeout)
                if stream:
                    return resp
                with resp:
                    raw = resp.read()
                if not parse:
                    return raw
                try:
                    return json.loads(raw)
                except ValueError:
                    raise _HTTPStatus(resp.status, "the answer is not JSON: " + raw[:200].decode(errors="replace"))
            except urllib.error.HTTPError as e:
                msg = _server_message(e.read() if e.fp else b"")
                e.close()
                if 500 <= e.code < 600:
                    last = _HTTPStatus(e.code, msg)
                    continue
                raise _HTTPStatus(e.code, msg) from None
            except TimeoutError as e:  # socket.timeout: the server hangs; retrying doubles the wait
                raise _Unreachable(f"no answer within {timeout:g} s ({e})") from None
            except (urllib.error.URLError, ConnectionError, HTTPException, OSError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, TimeoutError):
                    raise _Unreachable(f"no answer within {timeout:g} s") from None
                last = _Unreachable(f"{type(reason).__name__}: {reason}")
                continue
        if isinstance(last, _HTTPStatus):
            raise last
        raise _Unreachable(f"{last} (after {retries + 1} attempts)")

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._started:
            return
        if self.serve_cmd:
            try:
                self._launch()
                self._wait_healthy()
                self._resolve_model()
            except BaseException:  # includes KeyboardInterrupt: never leave a server behind
                self._stop_server()
                raise
        else:
            try:
                self._call("GET", "/v1/models", retries=max(self.options.retries, 0))
            except _Unreachable as e:
                raise EngineError(f"openai: no server answers at {self.base_url} ({e}); start it or fix base_url") from None
            except _HTTPStatus as e:
                if e.code in (401, 403):
                    raise EngineError(self._auth_hint(e)) from None
                # Some servers have no /v1/models: the first completion will tell.
        self._resolve_model()
        self._fetch_versions()
        self._started = True

    def _auth_hint(self, e: _HTTPStatus) -> str:
        if self.options.api_key_env and not self._api_key:
            return (f"openai: the server refused the request ({e}); environment variable "
                    f"{self.options.api_key_env} (api_key_env) is not set")
        if not self.options.api_key_env:
            return f"openai: the server refused the request ({e}); set api_key_env to the variable holding its key"
        return f"openai: the server refused the key from ${self.options.api_key_env} ({e})"

    def _launch(self) -> None:
        self._log_file, path, is_temp = open_log(
            self.log_path, "strict-gate-openai-", f"# strict-gate openai: launching {self._redact(self.serve_cmd)}"
        )
        if is_temp:
            self.log_path = path
        try:
            self._proc = spawn(
                self.serve_cmd, self.env, str(self.base_dir),
                stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            )
        except OSError as e:
            close_log(self._log_file)
            self._log_file = None
            raise EngineError(f"openai: cannot launch {self.serve_cmd[0]!r}: {e}") from None
        self._pgid = self._proc.pid  # a new session: the leader's pid is the group id
        if not self._atexit_registered:
            atexit.register(self._stop_server)
            self._atexit_registered = True

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                lines = f.read().decode("utf-8", errors="replace").splitlines()
        except (OSError, TypeError):
            return ""
        tail = "\n".join(lines[-LOG_TAIL_LINES:])
        return f"\n--- last lines of {self.log_path} ---\n{tail}" if tail else ""

    def _check_alive(self) -> None:
        """In launch mode, fail at once (exit code and log tail) when the server process is gone."""
        if self._proc is not None and self._proc.poll() is not None:
            raise _ServerExited(self._proc.returncode)

    def _wait_healthy(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.options.startup_timeout_s
        urls = [self.health_url] if self.health_url else ["/health", "/v1/models"]
        idx = 0
        last = "no answer yet"
        while True:
            if self._proc.poll() is not None:
                raise EngineError(
                    f"openai: the server exited with code {self._proc.returncode} while starting "
                    f"({' '.join(self.serve_cmd)}){self._log_tail()}"
                )
            try:
                self._call("GET", urls[idx], timeout=5.0, retries=0, parse=False)  # any 2xx, any body
                self.startup_s = time.monotonic() - t0
                return
            except _HTTPStatus as e:
                last = f"{urls[idx]}: {e}"
                if e.code == 404 and idx + 1 < len(urls):
                    idx += 1
                    continue
                if e.code in (401, 403):  # it answers: it is up (auth is checked on the first request)
                    self.startup_s = time.monotonic() - t0
                    return
            except _Unreachable as e:
                last = f"{urls[idx]}: {e}"
            if time.monotonic() > deadline:
                raise EngineError(
                    f"openai: the server was not healthy within startup_timeout_s = "
                    f"{self.options.startup_timeout_s:g} s (last: {last}); stopped it{self._log_tail()}"
                )
            time.sleep(0.5)

    def _stop_server(self) -> None:
        proc, pgid = self._proc, self._pgid
        if proc is None:
            return
        self._proc = None
        try:
            stop_group(proc, pgid, self.options.stop_timeout_s, KILL_WAIT_S)
        finally:
            close_log(self._log_file)
            self._log_file = None
            if self._atexit_registered:
                atexit.unregister(self._stop_server)
                self._atexit_registered = False

    def close(self) -> None:
        self._stop_server()
        self._started = False

    @property
    def server_pgid(self) -> int | None:
        """The launched server's process group (None in connect mode or once stopped)."""
        return self._pgid if self._proc is not None else None

    # ---------------------------------------------------------------- metadata
    def _resolve_model(self) -> str:
        if self._model is None:
            try:
                models = self._call("GET", "/v1/models")
            except (_HTTPStatus, _Unreachable) as e:
                raise EngineError(f"openai: model is not set and GET /v1/models failed ({e}); set model") from None
            data = models.get("data") if isinstance(models, dict) else None
            if not data or not isinstance(data[0], dict) or not data[0].get("id"):
                raise EngineError("openai: model is not set and GET /v1/models lists no model; set model")
            self._model = str(data[0]["id"])
        return self._model

    def _fetch_versions(self) -> dict:
        if self._versions is None:
            versions: dict = {}
            try:
                v = self._call("GET", "/version", timeout=10.0, retries=0)
                if isinstance(v, dict) and v.get("version"):
                    versions["server"] = str(v["version"])
            except (_HTTPStatus, _Unreachable):
                pass
            self._versions = versions
        return self._versions

    def _redact(self, obj):
        register(self._api_key)  # set after the engine was made: still scrubbed
        return scrub_json(obj)

    def info(self) -> EngineInfo:
        opts = asdict(self.options)
        opts["resolved_base_url"] = self.base_url
        if self.serve_cmd:
            opts["resolved_serve"] = list(self.serve_cmd)
        opts["served_model"] = self._model
        versions = dict(self._versions or {})
        versions.setdefault("client", "strict-gate openai (urllib)")
        return EngineInfo(
            kind=self.kind,
            model=self._redact(self._model or self.options.model),
            options=self._redact(opts),
            env=self._redact(dict(self.env)),
            versions=self._redact(versions),
            tokenizer=self._tokenizer_path or (f"server {self.base_url}/tokenize" if not self.options.tokenizer else None),
        )

    # ---------------------------------------------------------------- tokenize
    def tokenize(self, text: str) -> list[int]:
        if self._tokenizer_path is not None:
            if self._tok is None:
                from tokenizers import Tokenizer

                try:
                    self._tok = Tokenizer.from_file(self._tokenizer_path)
                except Exception as e:
                    raise ConfigError(f"openai: cannot load tokenizer {self._tokenizer_path}: {e}") from None
            return list(self._tok.encode(text).ids)
        if self.serve_cmd and not self._started:
            raise ConfigError(
                "openai: text prompts need a tokenizer before the server is launched; "
                "set tokenizer (a tokenizer.json or the model directory)"
            )
        try:
            out = self._call("POST", "/tokenize", {"model": self._resolve_model(), "prompt": text})
        except _HTTPStatus as e:
            if e.code in (404, 405):
                raise ConfigError(
                    f"openai: the server has no /tokenize endpoint ({e}); set tokenizer "
                    "(a tokenizer.json or the model directory)"
                ) from None
            raise EngineError(f"openai: /tokenize failed: {e}") from None
        except _Unreachable as e:
            raise EngineError(f"openai: /tokenize failed, no server at {self.base_url} ({e})") from None
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineError(f"openai: /tokenize answered without a token list: {str(out)[:200]}")
        return tokens

    # ---------------------------------------------------------------- generate
    def _extra(self) -> dict:
        body = {**NEUTRAL, **self.options.extra_body}
        return {k: v for k, v in body.items() if v is not None}

    def _payload(self, ids: Sequence[int], sampling: Sampling, stream: bool) -> dict:
        body = {
            **self._extra(),
            "model": self._resolve_model(),
            "prompt": list(ids),
            "max_tokens": sampling.max_tokens,
            "temperature": 0.0,  # explicit: the server's default comes from the model's generation config
            "n": 1,
            "echo": False,
            "logprobs": sampling.top_logprobs,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stream": stream,
        }
        return body

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        self.start()
        if sampling.temperature != 0:
            raise ConfigError("openai: strict-gate compares greedy decoding; temperature must be 0")
        try:
            for p in prompts:
                yield self._generate_one(p, sampling)
        except KeyboardInterrupt:
            self.close()
            raise

    def _died(self, p: PromptInput, what: str) -> EngineError:
        if self._proc is not None and self._proc.poll() is not None:
            return EngineError(
                f"openai: the server exited with code {self._proc.returncode} on prompt {p.id!r}{self._log_tail()}"
            )
        return EngineError(f"openai: the server failed on prompt {p.id!r}: {what}")

    def _generate_one(self, p: PromptInput, sampling: Sampling) -> Record:
        body = self._payload(p.token_ids, sampling, self.options.stream_timing)
        t0 = time.perf_counter()
        try:
            if self.options.stream_timing:
                choice, ttft = self._stream(body, t0)
            else:
                resp = self._call("POST", "/v1/completions", body)
                choice, ttft = self._choice(resp), None
        except _ServerExited:
            raise self._died(p, "server exited") from None
        except _Unreachable as e:
            raise self._died(p, str(e)) from None
        except _HTTPStatus as e:
            if e.code in (400, 422):  # this prompt's own problem (e.g. too long for the context)
                return Record(id=p.id, prompt_token_ids=p.token_ids, error=f"server rejected the request: {e}")
            if e.code in (401, 403):
                raise EngineError(self._auth_hint(e)) from None
            raise self._died(p, str(e)) from None
        except _PromptError as e:
            return Record(id=p.id, prompt_token_ids=p.token_ids, error=str(e))
        total = time.perf_counter() - t0
        return self._record(p, choice, sampling, Timing(ttft_s=ttft, total_s=total))

    @staticmethod
    def _choice(resp: object) -> dict:
        if not isinstance(resp, dict) or not resp.get("choices") or not isinstance(resp["choices"][0], dict):
            raise _PromptError(f"the server's answer has no choices: {str(resp)[:300]}")
        return resp["choices"][0]

    def _stream(self, body: dict, t0: float) -> tuple[dict, float | None]:
        """Stream one completion (SSE) and fold its chunks into one choice; TTFT = first token."""
        resp = self._call("POST", "/v1/completions", body, stream=True)
        merged: dict = {"logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": []}, "token_ids": None}
        ttft = None
        saw_logprobs = False
        try:
            with resp:
                for raw in resp:
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        break
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        raise _PromptError(f"unreadable stream chunk: {data[:200]}") from None
                    if isinstance(obj, dict) and obj.get("error"):
                        raise _PromptError(f"server error mid-stream: {_server_message(data.encode())}")
                    for ch in obj.get("choices") or []:
                        lp = ch.get("logprobs")
                        n_new = 0
                        if lp:
                            saw_logprobs = True
                            for key in ("tokens", "token_logprobs", "top_logprobs"):
                                merged["logprobs"][key].extend(lp.get(key) or [])
                            n_new = len(lp.get("tokens") or [])
                        if ch.get("token_ids") is not None:
                            merged["token_ids"] = (merged["token_ids"] or []) + list(ch["token_ids"])
                            n_new = n_new or len(ch["token_ids"])
                        if ch.get("prompt_token_ids") is not None:
                            merged["prompt_token_ids"] = ch["prompt_token_ids"]
                        if ch.get("finish_reason") is not None:
                            merged["finish_reason"] = ch["finish_reason"]
                        if n_new and ttft is None:
                            ttft = time.perf_counter() - t0
        except (TimeoutError, ConnectionError, HTTPException, OSError) as e:
            self._check_alive()
            raise _Unreachable(f"the stream broke: {type(e).__name__}: {e}") from None
        if "finish_reason" not in merged:
            self._check_alive()
            raise _Unreachable("the stream ended without a finish_reason")
        if not saw_logprobs:
            merged["logprobs"] = None
        return merged, ttft

    def _record(self, p: PromptInput, choice: dict, sampling: Sampling, timing: Timing) -> Record:
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        parsed = [_token_id(t) for t in tokens]
        as_ids = bool(tokens) and all(t is not None for t in parsed)
        server_ids = choice.get("token_ids")
        if server_ids is not None and not (isinstance(server_ids, list) and all(isinstance(t, int) for t in server_ids)):
            raise EngineError(f"openai: prompt {p.id!r}: token_ids in the answer is not a list of integers")
        if as_ids:
            gen = parsed
            if server_ids is not None and list(server_ids) != gen:
                raise EngineError(
                    f"openai: prompt {p.id!r}: the server's token_ids {server_ids} disagree with its "
                    f"logprobs tokens {gen}"
                )
        elif server_ids is not None:
            gen = list(server_ids)
        elif not tokens and lp and choice.get("finish_reason") is not None and not choice.get("text"):
            gen = []  # nothing generated (e.g. max_tokens 0)
        else:
            raise EngineError(
                "openai: the server cannot return token ids: its tokens came back as text "
                f"(e.g. {tokens[:3]!r}) and the answer has no token_ids. Comparing re-tokenized text is "
                "refused: it hides the differences this gate looks for. Use a server that supports "
                "return_tokens_as_token_ids / return_token_ids (vLLM does)."
            )
        top = None
        if as_ids or not tokens:
            top = self._top_logprobs(p, gen, lp) if lp else None
        # else: ids are known (token_ids) but the top-k came back as text: alternatives cannot be
        # identified without re-tokenizing, so no logprobs are recorded rather than guessed ones.
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            return Record(
                id=p.id, prompt_token_ids=p.token_ids, token_ids=tuple(gen),
                error=f"server finished with finish_reason {finish!r}", timing=timing,
            )
        reported = choice.get("prompt_token_ids")
        if isinstance(reported, list) and all(isinstance(t, int) for t in reported):
            prompt_ids = tuple(reported)
        else:
            prompt_ids = tuple(p.token_ids)
        return Record(
            id=p.id,
            prompt_token_ids=prompt_ids,
            token_ids=tuple(gen),
            finish_reason=finish,
            top_logprobs=top,
            timing=timing,
        )

    @staticmethod
    def _top_logprobs(p: PromptInput, gen: list[int], lp: dict):
        tops = lp.get("top_logprobs")
        sampled = lp.get("token_logprobs") or []
        if tops is None or len(tops) != len(gen):
            raise EngineError(
                f"openai: prompt {p.id!r}: the server returned {0 if tops is None else len(tops)} top_logprobs "
                f"steps for {len(gen)} tokens"
            )
        steps = []
        for i, (tok, step) in enumerate(zip(gen, tops)):
            pairs: dict[int, float] = {}
            for key, value in (step or {}).items():
                tid = _token_id(key)
                if tid is None:
                    raise EngineError(
                        f"openai: prompt {p.id!r} step {i}: a top-k token came back as text ({key!r}), not as "
                        "a token id; comparing re-tokenized text is refused"
                    )
                pairs[tid] = _logprob(value)
            if tok not in pairs and i < len(sampled) and sampled[i] is not None:
                pairs[tok] = _logprob(sampled[i])
            steps.append(sort_topk(pairs.items()))
        return tuple(steps)

    # ---------------------------------------------------------------- score
    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        """Teacher-forced: one request over prompt + continuation with prompt_logprobs = k."""
        if not self.options.prompt_logprobs:
            raise EngineError("openai: teacher-forced scoring is off (prompt_logprobs = false)")
        if not self.can_score:
            raise EngineError("openai: the server does not support teacher-forced scoring (prompt_logprobs)")
        self.start()
        if not continuation_ids:
            return []
        ids = list(prompt_ids) + list(continuation_ids)
        body = {
            **self._extra(),
            "model": self._resolve_model(),
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": k,
            "return_token_ids": True,
            "stream": False,
        }

        def unsupported(why: str) -> EngineError:
            self.can_score = False
            return EngineError(
                f"openai: the server does not support teacher-forced scoring: {why} "
                "(it needs vLLM's prompt_logprobs on /v1/completions)"
            )

        try:
            resp = self._call("POST", "/v1/completions", body)
        except _HTTPStatus as e:
            if e.code in (401, 403):
                raise EngineError(self._auth_hint(e)) from None
            if 400 <= e.code < 500 and ("logprob" in e.message.lower() or e.code in (404, 405, 501)):
                raise unsupported(f"it rejected prompt_logprobs = {k} ({e})") from None
            if 400 <= e.code < 500:
                raise EngineError(f"openai: the scoring request was rejected ({e})") from None
            raise EngineError(f"openai: scoring failed: {e}") from None
        except (_Unreachable, _ServerExited) as e:
            if self._proc is not None and self._proc.poll() is not None:
                raise EngineError(
                    f"openai: the server exited with code {self._proc.returncode} while scoring{self._log_tail()}"
                ) from None
            raise EngineError(f"openai: scoring failed, no answer from the server ({e})") from None
        try:
            choice = self._choice(resp)
        except _PromptError as e:
            raise EngineError(f"openai: scoring failed: {e}") from None
        plp = choice.get("prompt_logprobs")
        if not isinstance(plp, list):
            raise unsupported("its answer has no prompt_logprobs")
        if len(plp) != len(ids):
            raise EngineError(f"openai: prompt_logprobs has {len(plp)} entries for a prompt of {len(ids)} tokens")
        n = len(prompt_ids)
        out = []
        for i, tok in enumerate(continuation_ids):
            entry = plp[n + i]
            if not isinstance(entry, dict):
                raise EngineError(f"openai: prompt_logprobs[{n + i}] is {entry!r}, expected a dict")
            pairs: list[tuple[int, float]] = []
            logprob = None
            for key, val in entry.items():
                try:
                    tid = int(key)
                except ValueError:
                    tid = _token_id(key)
                if tid is None:
                    raise EngineError(f"openai: prompt_logprobs[{n + i}] has a non-id key {key!r}")
                lpv = _logprob(val["logprob"] if isinstance(val, dict) else val)
                rank = val.get("rank") if isinstance(val, dict) else None
                if tid == tok:
                    logprob = lpv
                # The answer holds the top-k plus the scored token itself; keep the top-k only.
                if tid != tok or rank is None or rank <= k:
                    pairs.append((tid, lpv))
            top = sort_topk(pairs)
            if len(top) > k:  # rank missing: drop the scored token if it is outside the top-k
                top = top[:k]
            out.append(ScoredStep(token_id=int(tok), logprob=logprob, top=top))
        return out


class _ServerExited(_Unreachable):
    def __init__(self, code: int):
        self.code = code
        super().__init__(f"the server process exited with code {code}")


class _PromptError(Exception):
    """A failure that belongs to one prompt (recorded on its Record, the run goes on)."""
