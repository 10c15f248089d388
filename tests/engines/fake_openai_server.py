"""The tests' one fake OpenAI-compatible completions server: stdlib only, on 127.0.0.1.

A deterministic "model": token i of a completion is (sum(prompt) + 7 * i) % 50 + 10 (fake_token),
its top-k alternatives the next ids with falling logprobs. What a server does is its Behaviour:
  Mode.IDS    vLLM-like: "token_id:N" tokens, token_ids and prompt_token_ids, prompt_logprobs
  Mode.TEXT   tokens as text, top-k keyed by text, no token ids (what a text-only server returns)
  Mode.DIE    like IDS, but the server stops listening on request number die_after + 1
  Mode.STATUS every completion answers HTTP `status` (503: retried; 400: not retried); with
              quote_auth its error message quotes the Authorization header it was sent
  Mode.IGNORE_IDS  a text-only server (vllm.cpp's): a prompt of token ids is silently ignored
              (the empty prompt is completed, `usage.prompt_tokens` 1), tokens as text, no logprobs
  Mode.TEXT_ONLY a text-only server (vllm.cpp's, Ollama-like): the prompt as text, tokenized with
              `tokenizer`; text back (streamed as text deltas), usage, no ids, no logprobs; the
              tokens of the stored run `replay` (by prompt ids) where it has them, else fake_token;
              /tokenize with `tokenize`. Its faults: ignore_prompt (completes the empty prompt, as
              vllm.cpp does with ids: usage.prompt_tokens 1), double_bos (a second BOS before the
              prompt), wrong_at (every token from that position on is
              another one, in the first wrong_prompts prompts served), flip_stop ((J, A, B): a
              reply whose token J is A has B there instead, and stops there: finish "stop", no EOS)
plus delay (seconds before each answer), pace ((ttft, per_token): a server of known speed),
prompt_logprobs (off: a server that cannot score) and events (a file that gets a line per request).

In process: FakeOpenAIServer(Behaviour(...)).start() ... .stop(), or the `fake_openai` fixture of
conftest.py, which stops every server it made. As a process, for launch mode (`serve`):
`python fake_openai_server.py --port N [--spawn-child] [--ignore-term] [--slow-start] [--delay S]
[--pidfile F] [--events F]` (flags in main()).
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "fake-model"


class Mode(enum.Enum):
    IDS = "ids"
    TEXT = "text"
    DIE = "die"
    STATUS = "status"
    IGNORE_IDS = "ignore_ids"
    TEXT_ONLY = "text_only"


@dataclass(frozen=True)
class Behaviour:
    mode: Mode = Mode.IDS
    die_after: int = 0
    status: int = 0
    quote_auth: bool = False
    prompt_logprobs: bool = True
    delay: float = 0.0
    pace: tuple[float, float] | None = None
    events: Path | None = None
    tokenizer: Path | None = None  # TEXT_ONLY: the tokenizer.json the "model" reads and writes text with
    replay: Path | None = None  # TEXT_ONLY: a run's records.jsonl whose tokens it answers
    tokenize: bool = False  # TEXT_ONLY: has vLLM's /tokenize
    ignore_prompt: bool = False
    double_bos: bool = False
    wrong_at: int | None = None
    wrong_prompts: int = 1 << 30  # how many distinct prompts (the first served) wrong_at spoils
    flaky: bool = False  # TEXT_ONLY: every second request's tokens come in reverse order
    usage: bool = True  # TEXT_ONLY: the answer states usage
    overrun: int = 0  # TEXT_ONLY: generates max_tokens + overrun tokens
    usage_lie: int = 0  # TEXT_ONLY: a reply that stopped (EOS) states this many more completion tokens
    flip_stop: tuple[int, int, int] | None = None  # TEXT_ONLY: (J, A, B): token J, where it is A, is B and the last
    no_stream: bool = False  # TEXT_ONLY: a request asking to stream is answered as a plain one (no events)
    hide_last: int = 0  # TEXT_ONLY: a reply cut at max_tokens leaves its last N tokens out of the text, usage counts
    # them (vllm.cpp leaves an incomplete UTF-8 character at the end out of its reply text)


def fake_token(prompt, i: int) -> int:
    return (sum(prompt) + 7 * i) % 50 + 10


class FakeOpenAIServer(ThreadingHTTPServer):
    """One server; posts, gets and authorizations record what it was asked."""

    daemon_threads = True

    def __init__(self, behaviour: Behaviour = Behaviour(), port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.behaviour = behaviour
        self.posts: list[dict[str, Any]] = []
        self.gets: list[str] = []
        self.authorizations: list[str | None] = []
        self._thread: threading.Thread | None = None
        self._text_model: _TextModel | None = None

    def text_model(self) -> _TextModel:
        if self._text_model is None:
            self._text_model = _TextModel(self.behaviour)
        return self._text_model

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def die(self) -> None:
        """Stop listening from inside a request (Mode.DIE): as if the process had died."""
        self.shutdown()
        self.server_close()

    def stop(self) -> None:
        """Stop serving and close the socket; safe twice and after the server died (Mode.DIE)."""
        if self._thread is not None:
            self.shutdown()  # returns at once once serve_forever has ended
            self._thread.join()
        self.server_close()


def _completion(b: Behaviour, body: dict[str, Any]) -> tuple[dict[str, Any], list[int], list[int]]:
    """The choice for a completion request, with the generated and the prompt ids."""
    prompt = list(body["prompt"])
    k = body.get("logprobs")
    text_mode = b.mode is Mode.TEXT
    name = (lambda t: f"tok{t}") if text_mode else (lambda t: f"token_id:{t}")
    gen = [fake_token(prompt, i) for i in range(body["max_tokens"])]
    choice: dict[str, Any] = {"index": 0, "text": "".join(f"tok{t}" for t in gen), "finish_reason": "length"}
    if k is not None:
        choice["logprobs"] = {
            "tokens": [name(t) for t in gen],
            "token_logprobs": [-0.1] * len(gen),
            "top_logprobs": [{name(t + j): -0.1 - 2.0 * j for j in range(max(k, 1))} for t in gen],
        }
    if not text_mode and body.get("return_token_ids"):
        choice["token_ids"] = gen
        choice["prompt_token_ids"] = prompt
    if body.get("prompt_logprobs") is not None and b.prompt_logprobs:
        kk = body["prompt_logprobs"]
        plp: list[dict[str, Any] | None] = [None]
        for j in range(1, len(prompt)):
            entry = {str(prompt[j] + 100 + r): {"logprob": -0.5 - r, "rank": r + 1} for r in range(kk)}
            entry.setdefault(str(prompt[j]), {"logprob": -9.0, "rank": 500})
            plp.append(entry)
        choice["prompt_logprobs"] = plp
    return choice, gen, prompt


class _TextModel:
    """The text-only mode's "model": a tokenizer, and the tokens of a stored run by prompt ids."""

    def __init__(self, b: Behaviour):
        from tokenizers import Tokenizer

        assert b.tokenizer is not None, "Mode.TEXT_ONLY needs a tokenizer"
        self.b = b
        self.tok = Tokenizer.from_file(str(b.tokenizer))
        self.runs: dict[tuple[int, ...], list[int]] = {}
        self.spoiled: set[tuple[int, ...]] = set()
        for line in (b.replay.read_text().splitlines() if b.replay else ()):
            r = json.loads(line)
            self.runs[tuple(r["prompt_token_ids"])] = r["token_ids"]

    def prompt_ids(self, text: str) -> list[int]:
        ids = list(self.tok.encode(text).ids) if not self.b.ignore_prompt else list(self.tok.encode("").ids)
        return ids[:1] + ids if self.b.double_bos else ids

    def generate(self, prompt: list[int], n: int) -> tuple[list[int], str]:
        gen = list(self.runs.get(tuple(prompt), [fake_token(prompt, i) for i in range(n)]))[:n]
        gen += [fake_token(prompt, i) for i in range(self.b.overrun)]  # past max_tokens
        if self.b.wrong_at is not None and (len(self.spoiled) < self.b.wrong_prompts or tuple(prompt) in self.spoiled):
            self.spoiled.add(tuple(prompt))
            gen = [t if i < self.b.wrong_at else (t + 17) % 900 + 50 for i, t in enumerate(gen)]
        j, was, flipped = self.b.flip_stop or (-1, None, None)
        if 0 <= j < len(gen) and gen[j] == was:
            gen = [*gen[:j], flipped]
        return gen, self.text(prompt, gen)

    def text(self, prompt: list[int], gen: list[int]) -> str:
        head = self.tok.decode(prompt, skip_special_tokens=True)
        full = self.tok.decode(prompt + gen, skip_special_tokens=True)
        return full[len(head):]


def _text_completion(model: _TextModel, body: dict[str, Any], n_request: int) -> tuple[dict[str, Any], list[str]]:
    """A text-only server's choice (with usage, None without) and its text deltas, one per token."""
    prompt = model.prompt_ids(body["prompt"] if isinstance(body["prompt"], str) else "")
    gen, text = model.generate(prompt, body["max_tokens"])
    if model.b.flaky and n_request % 2 == 0:
        gen = gen[::-1]
    eos = 2  # the tiny Llama's </s>: generation stops on it, as a server does
    if eos in gen:
        gen = gen[: gen.index(eos) + 1]
    stopped = model.b.flip_stop is not None and len(gen) == model.b.flip_stop[0] + 1 \
        and gen[-1] == model.b.flip_stop[2]
    finish = "stop" if gen and (gen[-1] == eos or stopped) else "length"
    told = len(gen) + (model.b.usage_lie if finish == "stop" else 0)
    if model.b.hide_last and finish == "length":
        gen = gen[: len(gen) - model.b.hide_last]
    text = model.text(prompt, gen)
    deltas = [model.text(prompt, gen[: i + 1])[len(model.text(prompt, gen[:i])):] for i in range(len(gen))]
    usage = {"prompt_tokens": len(prompt), "completion_tokens": told, "total_tokens": len(prompt) + told}
    return {"index": 0, "text": text, "finish_reason": finish, "usage": usage if model.b.usage else None}, deltas


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeOpenAIServer

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.gets.append(self.path)
        if self.path == "/health":  # like vLLM: 200 with an empty body
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL}]})
        elif self.path == "/version":
            self._send(200, {"version": "fake-1"})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        srv, b = self.server, self.server.behaviour
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/tokenize" and b.mode is Mode.TEXT_ONLY and b.tokenize:
            self._send(200, {"tokens": srv.text_model().prompt_ids(body["prompt"])})
            return
        if self.path != "/v1/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        srv.posts.append(body)
        srv.authorizations.append(self.headers.get("Authorization"))
        if b.events:
            with open(b.events, "a") as f:
                f.write("request\n")
        time.sleep(b.delay)
        if b.pace and not body.get("stream"):
            time.sleep(b.pace[0] + b.pace[1] * (body["max_tokens"] - 1))
        if b.mode is Mode.DIE and len(srv.posts) > b.die_after:
            # Stop listening and drop this connection without an answer: the process "died".
            self.close_connection = True
            threading.Thread(target=srv.die).start()
            return
        if b.mode is Mode.STATUS:
            quoted = f" (sent {self.headers.get('Authorization')})" if b.quote_auth else ""
            self._send(b.status, {"error": {"message": f"fake error {b.status}{quoted}", "code": b.status}})
            return
        if b.mode is Mode.IGNORE_IDS:
            gen = [fake_token([], i) for i in range(body["max_tokens"])]
            self._send(200, {"object": "text_completion", "model": MODEL, "usage": {
                "prompt_tokens": 1, "completion_tokens": len(gen), "total_tokens": 1 + len(gen)}, "choices": [
                {"index": 0, "text": "".join(f"tok{t}" for t in gen), "finish_reason": "length", "logprobs": None}]})
            return
        if b.mode is Mode.TEXT_ONLY:
            self._text_only(body)
            return
        choice, gen, prompt = _completion(b, body)
        if body.get("stream"):
            self._stream(choice, gen, prompt)
        else:
            self._send(200, {"object": "text_completion", "model": MODEL, "choices": [choice]})

    def _text_only(self, body: dict[str, Any]) -> None:
        choice, deltas = _text_completion(self.server.text_model(), body, len(self.server.posts))
        usage = choice.pop("usage")
        if not body.get("stream") or self.server.behaviour.no_stream:
            self._send(200, {"object": "text_completion", "model": MODEL, "choices": [choice], "usage": usage})
            return
        self._events([{"choices": [{"index": 0, "text": d, "finish_reason": None}]} for d in deltas]
                     + [{"choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}]},
                        {"choices": [], "usage": usage}])

    def _events(self, chunks: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def _stream(self, choice: dict[str, Any], gen: list[int], prompt: list[int]) -> None:
        """Server-sent events, one chunk per token, as vLLM streams."""
        pace = self.server.behaviour.pace
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        lp = choice.get("logprobs") or {}
        for i, t in enumerate(gen):
            if pace:
                time.sleep(pace[0] if i == 0 else pace[1])
            ch: dict[str, Any] = {"index": 0, "text": f"tok{t}", "finish_reason": "length" if i == len(gen) - 1 else None}
            if lp:
                ch["logprobs"] = {key: lp[key][i : i + 1] for key in ("tokens", "token_logprobs", "top_logprobs")}
            if "token_ids" in choice:
                ch["token_ids"] = [t]
                ch["prompt_token_ids"] = prompt if i == 0 else None
            self.wfile.write(f"data: {json.dumps({'choices': [ch]})}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


def main() -> None:
    """Launch mode: --delay answers each completion S seconds late; --pidfile writes the pids
    (server, child); --events gets a line per completion request and per SIGTERM received (with
    --ignore-term); --spawn-child starts a child in the same process group, like vLLM's engine core."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--spawn-child", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--slow-start", action="store_true")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--pidfile", type=Path)
    ap.add_argument("--events", type=Path)
    args = ap.parse_args()
    pids = [os.getpid()]
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pids.append(child.pid)
        print(f"child {child.pid}", flush=True)
    if args.pidfile:
        args.pidfile.write_text(" ".join(map(str, pids)))
    if args.ignore_term:
        def _ignored(*_):
            if args.events:
                with open(args.events, "a") as f:
                    f.write("sigterm\n")
        signal.signal(signal.SIGTERM, _ignored)
    if args.slow_start:
        time.sleep(1.0)
    print("fake server listening", flush=True)
    srv = FakeOpenAIServer(Behaviour(delay=args.delay, events=args.events), port=args.port)
    srv.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
