#!/usr/bin/env python
"""A command engine with a known speed, for the speed arm's method tests.

    python speed_engine.py [--ttft S] [--per-token S] [--stream] [--eos-at N] [--hello-json JSON]
                           [--die-after N] [--jitter A --seed S] [--log FILE --tag T]

It sleeps --ttft seconds before its first token and --per-token seconds before each later
one (defaults 0.2 and 0.05), so the gate must measure TTFT ~ 0.2 s and decode ~ 20 tok/s.
--stream declares the "stream" capability and writes a token event per token as it is made.
Without "ignore_eos" in a request it stops at token --eos-at (when given), as an EOS would.
--hello-json merges extra fields into the hello (e.g. '{"eager": false, "dtype": "float32"}').
--die-after N exits with code 7 on request number N + 1 (an engine that crashes mid-ladder).
--jitter A scales every sleep of a request by exp(u), u uniform in [-A, A] drawn per request
from a generator seeded with --seed: a known spread, wide enough to dwarf the machine's own
noise, whose scale factors have median 1, so two such engines' true speed ratio is the ratio
of their sleeps.
--log FILE appends the --tag to FILE as each request arrives (which arm ran when).
--clock FILE: virtual time (virtual_time.py): each sleep is added to FILE instead, which the
gate reads through tests/virtual_clock.py.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time

from virtual_time import VirtualTime


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ttft", type=float, default=0.2)
    ap.add_argument("--per-token", type=float, default=0.05)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--eos-at", type=int, default=0)
    ap.add_argument("--hello-json", default="{}")
    ap.add_argument("--die-after", type=int, default=-1)
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default="")
    ap.add_argument("--tag", default="")
    ap.add_argument("--clock", default="")
    args = ap.parse_args()
    vt = VirtualTime(args.clock)
    rng = random.Random(args.seed)
    caps = ["generate", "stream"] if args.stream else ["generate"]
    send({"hello": "strict-gate/engine@1", "name": "speed-engine", "version": "1", "capabilities": caps,
          **json.loads(args.hello_json)})
    for served, line in enumerate(sys.stdin):
        req = json.loads(line)
        if req.get("op") == "shutdown":
            return
        if served == args.die_after:
            sys.exit(7)
        if args.log:
            with open(args.log, "a") as f:
                f.write(args.tag + "\n")
        n = req["max_tokens"]
        if args.eos_at and not req.get("ignore_eos"):
            n = min(n, args.eos_at)
        base = req["prompt_token_ids"][-1] if req["prompt_token_ids"] else 0
        toks, t0 = [], time.perf_counter()
        scale = math.exp(rng.uniform(-args.jitter, args.jitter)) if args.jitter else 1.0
        for i in range(n):
            vt.pause(scale * (args.ttft if i == 0 else args.per_token))
            toks.append((base + i + 1) % 1000)
            if args.stream and req.get("stream"):
                before = vt.reads()
                send({"event": "token", "id": req["id"], "token_id": toks[-1]})
                vt.stamped(before)
        k = max(1, req.get("top_logprobs", 1))
        send({
            "id": req["id"],
            "token_ids": toks,
            "finish_reason": "length" if len(toks) == req["max_tokens"] else "stop",
            "top_logprobs": [[[t, -0.1]] + [[(t + 1 + j) % 1000, -5.0 - j] for j in range(k - 1)] for t in toks],
            "timing": {"ttft_s": args.ttft, "total_s": time.perf_counter() - t0},
        })


if __name__ == "__main__":
    main()
