#!/usr/bin/env python
"""A command engine (strict-gate/engine@1) that abuses what the gate gives it (tests/test_adversarial_engines.py).

    python hostile_engine.py [--max-context N|JSON] [--flood-stderr MB] [--requests FILE]

  --max-context V   put V (parsed as JSON: 8, "8", -1) in the hello as "max_context"
  --flood-stderr MB write MB mebibytes to stderr before the hello, between a first and a last line
  --requests FILE   append the length of every generate request's prompt to FILE, one a line

Generation echoes: token i is prompt_token_ids[-1] + i + 1, as tests/engines/fake_engine.py does.
"""

from __future__ import annotations

import argparse
import json
import sys


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def echo(req) -> dict:
    base = req["prompt_token_ids"][-1]
    toks = [base + i + 1 for i in range(req["max_tokens"])]
    k = req.get("top_logprobs", 1)
    tops = [[[t, -0.1]] + [[t + 1000 + j, -5.0 - j] for j in range(max(0, k - 1))] for t in toks]
    return {"id": req["id"], "prompt_token_ids": req["prompt_token_ids"], "token_ids": toks,
            "finish_reason": "length", "top_logprobs": tops}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-context", default=None)
    ap.add_argument("--flood-stderr", type=int, default=0)
    ap.add_argument("--requests", default=None)
    a = ap.parse_args()
    if a.flood_stderr:
        err = sys.stderr.buffer
        err.write(b"FIRST-LINE of the flood\n")
        line = b"x" * 1023 + b"\n"
        for _ in range(a.flood_stderr * 1024):
            err.write(line)
        err.write(b"LAST-LINE of the flood\n")
        err.flush()
    hello = {"hello": "strict-gate/engine@1", "name": "hostile", "version": "0", "capabilities": ["generate"]}
    if a.max_context is not None:
        hello["max_context"] = json.loads(a.max_context)
    send(hello)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "shutdown":
            break
        if a.requests:
            with open(a.requests, "a") as f:
                f.write(f"{len(req['prompt_token_ids'])}\n")
        send(echo(req))


if __name__ == "__main__":
    main()
