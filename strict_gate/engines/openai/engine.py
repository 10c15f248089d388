"""An OpenAI-compatible completions server (vLLM's `api_server`, or any server that speaks it).

Two modes:
- connect: `base_url` names a running server, or a list of running servers;
- launch: `serve` is a command (argv, no shell) that starts a server; `servers = N` launches N
  copies. `{port}` in `serve`, `base_url` or `health_url` is a free port on 127.0.0.1, a
  different one per copy, and `{server}` (0..N-1) in `serve` or in the arm's env values tells
  the copies apart (`CUDA_VISIBLE_DEVICES = "{server}"`: one GPU each). Each runs in its own
  process group with its output in a log file, is polled until healthy and is stopped as a
  group by close(), at exit and on Ctrl-C (openai_server.py, engines/process.py).

The HTTP requests and their parsing are in openai_client.py; with several servers the prompts
are shared out by openai_pool.py (one worker per server, batch 1 each, records in prompt
order, a failed server's prompt recorded as an error naming it, the rest going on).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from strict_gate.core.model_files import find_tokenizer_json
from strict_gate.core.redact import register, scrub_json
from strict_gate.engines.base import Engine, PromptInput, Serving, over_context
from strict_gate.engines.openai.client import (
    HTTPStatus,
    PromptError,
    Unreachable,
    parse_completion,
)
from strict_gate.engines.openai.options import OpenAIOptions, check_openai_options, connect_mode_refusal
from strict_gate.engines.openai.pool import ServerFailed, dispatch
from strict_gate.engines.openai.score import ScoringUnsupported, score_reply
from strict_gate.engines.openai.server import Server, arm_servers, served_context
from strict_gate.engines.openai.text_only import repeat_problem, require_text, server_tokenize, text_body, text_record
from strict_gate.engines.speculative import Acceptance, Speculation, counters_acceptance, prometheus_counters
from strict_gate.errors import ConfigError, EngineError
from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep, Timing

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Sent with every completion so that the server's greedy choice is the raw argmax, whatever
# defaults the model's generation_config carries (vLLM's server applies them to requests).
NEUTRAL = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


class OpenAIEngine(Engine):
    kind = "openai"
    speaks_http = True
    Options = OpenAIOptions
    can_score = True
    in_process = False
    writes_log = True
    streams = True  # server-sent events (the speed arm times each token on receipt)
    can_batch = True  # concurrent requests, one thread each
    servings = frozenset({Serving.BATCH, Serving.CONCURRENCY})  # a server's own prefill and cache are its own

    def __init__(self, options: OpenAIOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        if not options.prompt_logprobs or options.text_only:
            self.can_score = False
        self.needs_text = options.text_only
        if options.text_only and not options.tokenizer:
            raise ConfigError("openai: text_only = true needs tokenizer (a tokenizer.json or the model directory): "
                              "the server's text is tokenized with it")
        self.servers = arm_servers(options, self.env, self.base_dir)
        self.port = self.servers[0].port
        self.base_url = self.servers[0].base_url
        self._model: str | None = options.model
        self._versions: dict | None = None
        self._context: int | None = None  # the model's context as the server states it, once started
        self._started = False
        self.startup_s: float | None = None  # launch mode: seconds from launch to the last server healthy
        self._tok: Tokenizer | None = None
        self._tokenizer_path = self._resolve_tokenizer(options.tokenizer) if options.tokenizer else None
        if options.serve:  # a server it launches can be launched speculating (with_speculative)
            self.servings = OpenAIEngine.servings | {Serving.SPECULATIVE}
        self.speculative: Speculation | None = None
        self._repeated = False  # text_only: the same-prompt-twice check was made
        self._no_tokenize = False  # text_only: the server has no /tokenize
        register(self._api_key)  # scrubbed from whatever is written, from now on

    # ---------------------------------------------------------------- configuration
    @classmethod
    def check_options(cls, options: OpenAIOptions, *, where: str, line_of) -> None:
        check_openai_options(options, where=where, line_of=line_of)

    @classmethod
    def pool_refusal(cls, options: OpenAIOptions) -> str | None:
        return connect_mode_refusal(options)

    def check_prompt_set(self, ps, arm: str) -> None:
        if self.options.text_only:
            require_text(ps, arm)

    def _resolve_tokenizer(self, spec: str) -> str:
        path = find_tokenizer_json(spec, self.base_dir)
        if path is None:
            raise ConfigError(
                f"openai: tokenizer {spec!r}: no tokenizer.json there "
                "(give a tokenizer.json file or a model directory that has one)"
            )
        return str(path)

    def _log_for(self, s: Server) -> str | Path | None:
        """The run's engine.log for one server; engine-0.log, engine-1.log... for several."""
        if self.log_path is None or len(self.servers) == 1:
            return self.log_path
        p = Path(self.log_path)
        return p.with_name(f"{p.stem}-{s.index}{p.suffix}")

    # ---------------------------------------------------------------- lifecycle
    @property
    def _api_key(self) -> str | None:
        return self.servers[0].client.api_key

    def start(self) -> None:
        if self._started:
            return
        try:
            for s in self.servers:
                if s.process is not None:
                    s.process.log_path = self._log_for(s)
                    s.process.launch(self._redact(s.process.argv))
            for s in self.servers:
                if s.process is not None:
                    s.process.wait_healthy(s.client, s.health_url, self.options.startup_timeout_s)
                else:
                    self._connect(s)
            self._describe_servers()
        except BaseException:  # includes KeyboardInterrupt: never leave a server behind
            self.close()
            raise
        launched = [s.process.startup_s for s in self.servers if s.process is not None and s.process.startup_s is not None]
        self.startup_s = max(launched) if launched else None
        self._started = True

    def _connect(self, s: Server) -> None:
        try:
            s.client.call("GET", "/v1/models")
        except Unreachable as e:
            raise EngineError(f"openai: no server answers at {s.base_url} ({e}); start it or fix base_url") from None
        except HTTPStatus as e:
            if e.code in (401, 403):
                raise EngineError(self._auth_hint(e)) from None
            # Some servers have no /v1/models: the first completion will tell.

    def _describe_servers(self) -> None:
        """Model name and versions; several servers must serve the same model, same versions."""
        models = {self._resolve_model(s) for s in self.servers}
        versions = [self._fetch_versions(s) for s in self.servers]
        if len(models) > 1 or any(v != versions[0] for v in versions):
            raise EngineError(
                "openai: the servers of one arm must be identical, but they serve "
                + "; ".join(f"{s.name}: model {self._resolve_model(s)!r}, versions {v}" for s, v in zip(self.servers, versions))
            )
        self._model = models.pop()
        self._versions = versions[0]
        self._context = served_context(self.servers[0].client, self._model)

    def _auth_hint(self, e: HTTPStatus) -> str:
        env = self.options.api_key_env
        if env and not self._api_key:
            return f"openai: the server refused the request ({e}); environment variable {env} (api_key_env) is not set"
        if not env:
            return f"openai: the server refused the request ({e}); set api_key_env to the variable holding its key"
        return f"openai: the server refused the key from ${env} ({e})"

    def close(self) -> None:
        for s in self.servers:
            if s.process is not None:
                s.process.stop()
        self._started = False

    @property
    def server_pgid(self) -> int | None:
        """The first launched server's process group (None in connect mode or once stopped)."""
        return self.servers[0].process.pgid if self.servers[0].process is not None else None

    # ---------------------------------------------------------------- metadata
    def _resolve_model(self, s: Server | None = None) -> str:
        if self.options.model is not None:
            return self.options.model
        if s is None:
            if self._model is not None:
                return self._model
            s = self.servers[0]
        try:
            models = s.client.call("GET", "/v1/models")
        except (HTTPStatus, Unreachable) as e:
            raise EngineError(f"openai: model is not set and GET /v1/models failed ({e}); set model") from None
        data = models.get("data") if isinstance(models, dict) else None
        if not data or not isinstance(data[0], dict) or not data[0].get("id"):
            raise EngineError("openai: model is not set and GET /v1/models lists no model; set model")
        return str(data[0]["id"])

    @staticmethod
    def _fetch_versions(s: Server) -> dict:
        try:
            v = s.client.call("GET", "/version", timeout=10.0, retries=0)
        except (HTTPStatus, Unreachable):
            return {}
        return {"server": str(v["version"])} if isinstance(v, dict) and v.get("version") else {}

    def _redact(self, obj):
        register(self._api_key)  # set after the engine was made: still scrubbed
        return scrub_json(obj)

    def _describe(self, s: Server) -> dict:
        if s.process is None:
            return {"base_url": s.base_url}
        log = s.process.log_path or self._log_for(s)
        return {"base_url": s.base_url, "serve": s.process.argv, "log": None if log is None else str(log)}

    def info(self) -> EngineInfo:
        opts = asdict(self.options)
        opts["resolved_base_url"] = self.base_url
        if self.servers[0].process is not None:
            opts["resolved_serve"] = list(self.servers[0].process.argv)
        if len(self.servers) > 1:
            opts["resolved_servers"] = [self._describe(s) for s in self.servers]
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
    def tokenizer_file(self) -> Path | None:
        """The `tokenizer` given, else one beside the served model when its name is a local path."""
        if self._tokenizer_path is not None:
            return Path(self._tokenizer_path)
        return find_tokenizer_json(self.options.model, self.base_dir) if self.options.model else None

    def _tokenizer(self) -> Tokenizer:
        """The `tokenizer` given, loaded once."""
        if self._tok is None:
            from tokenizers import Tokenizer

            try:
                self._tok = Tokenizer.from_file(str(self._tokenizer_path))
            except Exception as e:
                raise ConfigError(f"openai: cannot load tokenizer {self._tokenizer_path}: {e}") from None
        return self._tok

    def tokenize(self, text: str) -> list[int]:
        if self._tokenizer_path is not None:
            return list(self._tokenizer().encode(text).ids)
        if self.options.serve and not self._started:
            raise ConfigError(
                "openai: text prompts need a tokenizer before the server is launched; "
                "set tokenizer (a tokenizer.json or the model directory)"
            )
        try:
            out = self.servers[0].client.call("POST", "/tokenize", {"model": self._resolve_model(), "prompt": text})
        except HTTPStatus as e:
            if e.code in (404, 405):
                raise ConfigError(
                    f"openai: the server has no /tokenize endpoint ({e}); set tokenizer "
                    "(a tokenizer.json or the model directory)"
                ) from None
            raise EngineError(f"openai: /tokenize failed: {e}") from None
        except Unreachable as e:
            raise EngineError(f"openai: /tokenize failed, no server at {self.base_url} ({e})") from None
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineError(f"openai: /tokenize answered without a token list: {str(out)[:200]}")
        return tokens

    # ---------------------------------------------------------------- generate
    def _extra(self) -> dict:
        body = {**NEUTRAL, **self.options.extra_body}
        return {k: v for k, v in body.items() if v is not None}

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        self.start()
        if sampling.temperature != 0:
            raise ConfigError("openai: strict-gate compares greedy decoding; temperature must be 0")
        try:
            if len(self.servers) == 1:  # a server failure fails the arm (EngineError)
                for p in prompts:
                    yield self._generate_one(self.servers[0], p, sampling)
            else:
                yield from dispatch(self.servers, prompts, lambda s, p: self._generate_one(s, p, sampling),
                                    lambda s: s.name)
        except KeyboardInterrupt:
            self.close()
            raise

    def _label(self, s: Server) -> str:
        return "the server" if len(self.servers) == 1 else s.name

    def _died(self, s: Server, what: str) -> ServerFailed:
        s.failed = True
        code = s.process.returncode if s.process is not None else None
        if code is not None and s.process is not None:
            return ServerFailed(f"openai: {self._label(s)} exited with code {code} {what}{s.process.log_tail()}")
        return ServerFailed(f"openai: {self._label(s)} failed {what}")

    def speed_settings(self) -> dict:
        """Known only for a launched vLLM server (its flags); a server given by base_url is unknown,
        but for the context that its /v1/models states."""
        from strict_gate.engines.vllm.args import vllm_serve_settings

        settings = vllm_serve_settings(list(self.options.serve or []))
        if settings.get("max_context") is None and self._context is not None:
            settings["max_context"] = self._context
        return settings

    def with_speculative(self, spec: Speculation) -> OpenAIEngine:
        """The serve command launched with `--speculative-config` (vLLM's server flag) set to `spec`."""
        if not self.options.serve:
            raise EngineError("openai: a server given by base_url cannot be relaunched speculating")
        argv = [*self.options.serve, "--speculative-config", json.dumps(spec.to_json())]
        engine = OpenAIEngine(replace(self.options, serve=argv), self.env, self.base_dir)
        engine.speculative = spec
        engine.log_path = self.log_path
        return engine

    def acceptance(self) -> Acceptance | None:
        """The launched servers' spec-decode counters from GET /metrics, summed; None: unknown."""
        if self.speculative is None or not self._started:
            return None
        total: Acceptance | None = None
        for s in self.servers:
            try:
                page = s.client.call("GET", "/metrics", parse=False, retries=0).decode("utf-8", "replace")
            except (EngineError, HTTPStatus, Unreachable, UnicodeError):
                return None
            got = counters_acceptance(prometheus_counters(page))
            if got is None:
                return None
            total = got if total is None else total + got
        return total

    def stream_one(self, prompt: PromptInput, sampling: Sampling, on_token) -> Record:
        self.start()
        return self._generate_one(self.servers[0], prompt, sampling, on_token=on_token)

    def generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> list[Record]:
        """All prompts in flight at once (a thread each), shared out over the arm's servers."""
        from concurrent.futures import ThreadPoolExecutor

        self.start()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            futures = [pool.submit(self._generate_one, self.servers[i % len(self.servers)], p, sampling)
                       for i, p in enumerate(prompts)]
            return [f.result() for f in futures]

    def generate_concurrent(self, prompts: Sequence[PromptInput], sampling: Sampling, in_flight: int
                            ) -> Iterator[Record]:
        """A sliding window: a new request starts as soon as one of the `in_flight` finishes."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        self.start()
        todo = list(enumerate(prompts))
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            running: set = set()
            while todo or running:
                while todo and len(running) < in_flight:
                    i, p = todo.pop(0)
                    running.add(pool.submit(self._generate_one, self.servers[i % len(self.servers)], p, sampling))
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    yield f.result()

    def _generate_one(self, s: Server, p: PromptInput, sampling: Sampling, on_token=None) -> Record:
        refused = over_context(p, sampling, self.speed_settings().get("max_context"))
        if refused is not None:
            return refused
        if self.options.text_only:
            return self._text_one(s, p, sampling, on_token)
        body = {
            **self._extra(),
            "model": self._resolve_model(),
            "prompt": list(p.token_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": 0.0,  # explicit: the server's default comes from the model's generation config
            "n": 1,
            "echo": False,
            "logprobs": sampling.top_logprobs,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stream": self.options.stream_timing or on_token is not None,
        }
        if sampling.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extra parameter; the real token count is recorded either way
        answer = self._request(s, p, body, on_token)
        if isinstance(answer, Record):
            return answer
        choice, timing = answer
        return parse_completion(p, choice, timing)

    def _request(self, s: Server, p: PromptInput, body: dict, on_token=None) -> tuple[dict, Timing] | Record:
        """One completion: its choice and timing, an error record for the prompt's own failure,
        ServerFailed or EngineError for the server's."""
        t0 = time.perf_counter()
        try:
            choice, ttft = s.client.complete(body, on_token)
        except Unreachable as e:  # includes ServerExited
            raise self._died(s, f"on prompt {p.id!r}: {e}") from None
        except HTTPStatus as e:
            if e.code in (400, 422):  # this prompt's own problem (e.g. too long for the context)
                return Record(id=p.id, prompt_token_ids=p.token_ids, error=f"server rejected the request: {e}")
            if e.code in (401, 403):
                raise EngineError(self._auth_hint(e)) from None
            raise self._died(s, f"on prompt {p.id!r}: {e}") from None
        except PromptError as e:
            return Record(id=p.id, prompt_token_ids=p.token_ids, error=str(e))
        s.served.append(p.id)
        return choice, Timing(ttft_s=ttft, total_s=time.perf_counter() - t0)

    def _text_one(self, s: Server, p: PromptInput, sampling: Sampling, on_token=None) -> Record:
        """A text-only request (text_only.py); the first prompt of the arm is sent twice, and two
        different texts make its record an error (a non-deterministic server)."""
        stream = self.options.stream_timing or on_token is not None
        body = {**self._extra(), "model": self._resolve_model(), **text_body(p, sampling, stream)}
        answer = self._request(s, p, body, on_token)
        if isinstance(answer, Record):
            return answer
        rec = text_record(p, answer[0], self._tokenizer(), sampling, answer[1], self._server_tokenize(s, p))
        if self._repeated or rec.error is not None:
            return rec
        self._repeated = True
        plain = {k: v for k, v in body.items() if k != "stream_options"}
        again = self._request(s, p, {**plain, "stream": False})
        if isinstance(again, Record):
            return replace(rec, error=f"the repeated request failed: {again.error}", token_ids=(), text_only=None)
        problem = repeat_problem(rec, text_record(p, again[0], self._tokenizer(), sampling, again[1], None))
        return rec if problem is None else replace(rec, error=problem, token_ids=(), text_only=None, finish_reason=None)

    def _server_tokenize(self, s: Server, p: PromptInput) -> list[int] | None:
        """The server's own tokenization of the prompt text (vLLM's /tokenize), None when it has none."""
        if self._no_tokenize:
            return None
        try:
            ids = server_tokenize(s.client, self._resolve_model(), p)
        except Unreachable as e:
            raise self._died(s, f"on /tokenize of prompt {p.id!r}: {e}") from None
        self._no_tokenize = ids is None
        return ids

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
        s = next((s for s in self.servers if not s.failed), None)
        if s is None:
            raise EngineError("openai: cannot score, every server of the arm has failed")
        ids = list(prompt_ids) + list(continuation_ids)
        body = {**self._extra(), "model": self._resolve_model(), "prompt": ids, "max_tokens": 1,
                "temperature": 0.0, "prompt_logprobs": k, "return_token_ids": True, "stream": False}
        try:
            return score_reply(s, body, ids, len(prompt_ids), continuation_ids, k, auth_hint=self._auth_hint,
                               died=self._died)
        except ScoringUnsupported:
            self.can_score = False
            raise
