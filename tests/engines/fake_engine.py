#!/usr/bin/env python
"""A fake engine speaking strict-gate/engine@1, good or misbehaving on purpose (for the tests).

    python fake_engine.py [--mode MODE] [--canned FILE] [--after N] [--pidfile F] [--events F]
                          [--shutdown-delay S] [--ignore-term] [--score-model]

Modes (the misbehaviour starts at request number --after, counting from 0):
  good          replay canned responses from FILE (one JSON object a line, popped in
                order, id replaced by the request's); when the queue is empty, echo:
                token i is prompt_token_ids[-1] + i + 1, logprob -0.1 * (i + 1)
  bad_json      answer with a line that is not JSON
  wrong_id      answer with another id
  exit          print a traceback-like message on stderr and exit with code 3
  crash         die by SIGSEGV (after a stderr line)
  hang          never answer (reads the request, then sleeps)
  hang_hard     like hang, and ignores SIGTERM (the gate must SIGKILL)
  spawn_hang    start a grandchild (sleep 300) in the same group, then hang
  invalid       answer with a record that fails validation (finish_reason "eos")
  error         answer {"id", "error"}: a per-prompt failure the engine survives
  no_hello      never write the hello (startup hang)
  old_hello     speak another protocol version
  banner        print a non-JSON banner before the hello (tolerated)
  no_score      declare only "generate"
  extra_tokens  generate more tokens than max_tokens
  bad_score     answer score requests with one step too few
  score_error   answer score requests with {"id", "error"}

Its score op ranks each token it is given its argmax at -0.5, whatever it generates; with
--score-model it scores by the echo model it generates by (a [rescorer] that is the reference
proves itself so: gate/rescorer_proof.py), a token that model does not list at -20.

The hello carries "pid" so a test can check that the whole group is gone afterwards.
Env: FAKE_ECHO_ENV=NAME puts os.environ[NAME] into the hello's "versions".

For the signal tests, which watch a whole `strict-gate gate` from outside:
  --pidfile F         write the pid to F at start
  --events F          append "start", "request ID", "shutdown" and "sigterm" lines to F as they happen
  --shutdown-delay S  on shutdown (or EOF), take S seconds to exit (a slow shutdown)
  --ignore-term       ignore SIGTERM (noted in --events): only SIGKILL stops it
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def echo(req, n=None):
    k = req.get("top_logprobs", 1)
    base = req["prompt_token_ids"][-1] if req["prompt_token_ids"] else 0
    n = req["max_tokens"] if n is None else n
    toks = [base + i + 1 for i in range(n)]
    tops = [[[t, -0.1 * (i + 1)]] + [[t + 1000 + j, -5.0 - j] for j in range(max(0, k - 1))] for i, t in enumerate(toks)]
    return {
        "id": req["id"],
        "prompt_token_ids": req["prompt_token_ids"],
        "token_ids": toks,
        "finish_reason": "length",
        "top_logprobs": tops,
        "timing": {"ttft_s": 0.001, "total_s": 0.002},
    }


def score(req):
    k = req.get("top_logprobs", 1)
    steps = []
    for i, t in enumerate(req["continuation_ids"]):
        steps.append({"token_id": t, "logprob": -0.5, "top": [[t, -0.5]] + [[t + 1 + j, -1.0 - j] for j in range(k - 1)]})
    return {"id": req["id"], "steps": steps}


def score_model(req):
    """The echo model teacher-forced: at position i its argmax is prompt_token_ids[-1] + i + 1, listed as echo() lists it."""
    k = req.get("top_logprobs", 1)
    base = req["prompt_token_ids"][-1] if req["prompt_token_ids"] else 0
    steps = []
    for i, t in enumerate(req["continuation_ids"]):
        a = base + i + 1
        top = [[a, -0.1 * (i + 1)]] + [[a + 1000 + j, -5.0 - j] for j in range(max(0, k - 1))]
        steps.append({"token_id": t, "logprob": next((v for u, v in top if u == t), -20.0), "top": top})
    return {"id": req["id"], "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="good")
    ap.add_argument("--canned", default=None)
    ap.add_argument("--after", type=int, default=0)
    ap.add_argument("--pidfile", default=None)
    ap.add_argument("--events", default=None)
    ap.add_argument("--shutdown-delay", type=float, default=0.0)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--score-model", action="store_true")
    a = ap.parse_args()

    def event(text: str) -> None:
        if a.events:
            with open(a.events, "a") as f:
                f.write(text + "\n")

    if a.pidfile:
        with open(a.pidfile, "w") as f:
            f.write(str(os.getpid()))
    if a.ignore_term:
        signal.signal(signal.SIGTERM, lambda *_: event("sigterm"))
    event("start")
    mode = a.mode
    canned = []
    if a.canned:
        with open(a.canned) as f:
            canned = [json.loads(line) for line in f if line.strip()]

    print(f"fake engine {mode} starting, pid {os.getpid()}", file=sys.stderr, flush=True)
    if mode == "hang_hard":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "no_hello":
        time.sleep(300)
        return
    if mode == "banner":
        print("FakeLib v1.0 (c) nobody; loading...", flush=True)
    caps = ["generate"] if mode == "no_score" else ["generate", "score"]
    versions = {}
    if os.environ.get("FAKE_ECHO_ENV"):
        name = os.environ["FAKE_ECHO_ENV"]
        versions[name] = os.environ.get(name, "<unset>")
    send({
        "hello": "strict-gate/engine@0" if mode == "old_hello" else "strict-gate/engine@1",
        "name": "fake",
        "version": "0.0.1",
        "model": "fake-model",
        "capabilities": caps,
        "versions": versions,
        "pid": os.getpid(),
    })

    n = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "shutdown":
            break
        event(f"request {req.get('id')}")
        misbehave = n >= a.after
        n += 1
        if op == "score" and misbehave and mode == "bad_score":
            out = score(req)
            out["steps"] = out["steps"][:-1]
            send(out)
            continue
        if op == "score" and misbehave and mode == "score_error":
            send({"id": req["id"], "error": "scoring not supported for this model"})
            continue
        if not misbehave or mode in ("good", "drop_bos", "banner", "no_score", "old_hello", "bad_score", "score_error"):
            if op == "score":
                send(score_model(req) if a.score_model else score(req))
            elif mode == "drop_bos":  # an engine that re-tokenized the text without its BOS
                out = echo(req)
                out["prompt_token_ids"] = req["prompt_token_ids"][1:]
                send(out)
            elif canned:
                out = dict(canned.pop(0))
                out["id"] = req["id"]
                send(out)
            else:
                send(echo(req))
            continue
        if mode == "bad_json":
            sys.stdout.write('{"id": "' + req["id"] + '", "token_ids": [1, 2,\n')
            sys.stdout.flush()
        elif mode == "wrong_id":
            out = echo(req)
            out["id"] = req["id"] + "-other"
            send(out)
        elif mode == "exit":
            print("Traceback (most recent call last):\n  File engine.cpp line 42\nRuntimeError: CUDA out of memory",
                  file=sys.stderr, flush=True)
            sys.exit(3)
        elif mode == "crash":
            print("about to segfault", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        elif mode in ("hang", "hang_hard"):
            time.sleep(300)
        elif mode == "spawn_hang":
            child = subprocess.Popen(["sleep", "300"])
            print(f"grandchild pid {child.pid}", file=sys.stderr, flush=True)
            time.sleep(300)
        elif mode == "invalid":
            out = echo(req)
            out["finish_reason"] = "eos"
            send(out)
        elif mode == "error":
            send({"id": req["id"], "error": "prompt too long for the KV cache"})
        elif mode == "extra_tokens":
            send(echo(req, n=req["max_tokens"] + 2))
        else:
            raise SystemExit(f"unknown mode {mode}")
    print("fake engine: shutdown", file=sys.stderr, flush=True)
    event("shutdown")
    time.sleep(a.shutdown_delay)


if __name__ == "__main__":
    main()
