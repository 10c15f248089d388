#!/usr/bin/env python
"""A slow command engine (strict-gate/engine@1) for the resume tests: it is killed mid-run.

    python slow_engine.py [--delay S] [--error-if FILE] [--diverge ID] [--pidfile F]

Each generate request is answered after S seconds with the echo continuation (token i is
prompt_token_ids[-1] + i + 1). While FILE exists, every request is answered with a
per-prompt error reply instead (the engine survives it). --diverge ID answers prompt ID with
other tokens (a failing gate). The hello states versions {"adv": "1"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def reply(req: dict, shift: int) -> dict:
    k = req.get("top_logprobs", 1)
    base = (req["prompt_token_ids"][-1] if req["prompt_token_ids"] else 0) + shift
    toks = [base + i + 1 for i in range(req["max_tokens"])]
    tops = [[[t, -0.1]] + [[t + 1000 + j, -5.0 - j] for j in range(max(0, k - 1))] for t in toks]
    return {"id": req["id"], "prompt_token_ids": req["prompt_token_ids"], "token_ids": toks,
            "finish_reason": "length", "top_logprobs": tops}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--error-if", default=None)
    ap.add_argument("--diverge", default=None)
    ap.add_argument("--pidfile", default=None)
    a = ap.parse_args()
    if a.pidfile:
        with open(a.pidfile, "a") as f:
            f.write(f"{os.getpid()}\n")
    send({"hello": "strict-gate/engine@1", "name": "slow", "version": "1", "model": "slow-model",
          "capabilities": ["generate"], "versions": {"adv": "1"}, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "shutdown":
            break
        time.sleep(a.delay)
        if a.error_if and os.path.exists(a.error_if):
            send({"id": req["id"], "error": "out of KV cache blocks"})
        else:
            send(reply(req, 50 if req["id"] == a.diverge else 0))


if __name__ == "__main__":
    main()
