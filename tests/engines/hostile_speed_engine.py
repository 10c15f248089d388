#!/usr/bin/env python
"""A command engine that tries to talk the speed arm into a pass (tests/test_adversarial_speed.py).

    python hostile_speed_engine.py --trick TRICK [--ttft S] [--per-token S] [--stream] [--hello-json JSON]
                                   [--clock FILE]

It answers like tests/engines/speed_engine.py (token i of a reply is (last prompt id + i + 1)
% 1000, chosen with logprob -0.1; --ttft seconds before the first token, --per-token before
each later one; --clock FILE: in virtual time, virtual_time.py), except where its trick says otherwise:

  burst       (with --stream) writes every token event at once, straight away, then takes the
              honest time (ttft + per-token each) before it replies
  event-ids   (with --stream) token events carry 999, whatever the reply holds
  zeros       a request with "ignore_eos" (the speed arm's) gets [0, 0, ...] at once; a
              gate's own requests are answered honestly
  slow-first  a max_tokens = 1 request takes --slow seconds; a full request takes --slow
              seconds before its first token, then --per-token each (almost as slow)
  cache       a prompt equal to the previous request's skips its prefill (--ttft): a
              one-entry prefix cache
  tie         a timed request (with "ignore_eos") answers honestly and reports its token at
              position 1 0.01 nats above a runner-up (token + 500): a near-tie
  tie-garbage the same tie, flipped: position 1 is the runner-up, then zeros to the end, each
              claimed as its own top-1
  tie-stop    the same tie, flipped: position 1 is the runner-up, then the EOS (2), where the
              reply stops (finish "stop", 3 tokens), ignore_eos or not
  eos-masked  honours ignore_eos as transformers does (min_new_tokens): at position 1 the model's
              argmax is the EOS (2), masked, so it emits its runner-up (the honest token) and lists
              the EOS above it (its logprobs are read before the mask)
  eos-emitted honours ignore_eos as vLLM does: at position 1 it emits the EOS as an ordinary token
              and goes on
"""

from __future__ import annotations

import argparse
import json
import sys

from virtual_time import VirtualTime

VT = VirtualTime(None)  # main() sets --clock

def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def tokens_for(req: dict) -> list[int]:
    base = req["prompt_token_ids"][-1] if req["prompt_token_ids"] else 0
    return [(base + i + 1) % 1000 for i in range(req["max_tokens"])]


def reply(req: dict, toks: list[int], tie: int | None = None, finish: str = "length") -> dict:
    """`tie`: the other token of a 0.01-nat tie at position 1 (listed second there)."""
    k = max(1, req.get("top_logprobs", 1))
    tops = [[[t, -0.1]] + [[(t + 1 + j) % 1000, -5.0 - j] for j in range(k - 1)] for t in toks]
    if tie is not None and len(toks) > 1:
        tops[1] = [[toks[1], -0.1], [tie, -0.11]] + tops[1][1:k - 1]
    return {"id": req["id"], "token_ids": toks, "finish_reason": finish, "top_logprobs": tops}


def event(req: dict, t: int) -> None:
    before = VT.reads()
    send({"event": "token", "id": req["id"], "token_id": t})
    VT.stamped(before)


def serve(args, req: dict, previous: list[int] | None) -> None:
    toks = tokens_for(req)
    streaming = args.stream and req.get("stream")
    if args.trick == "zeros" and req.get("ignore_eos"):
        toks = [0] * req["max_tokens"]
        for t in toks if streaming else ():
            event(req, t)
        send(reply(req, toks))
        return
    if args.trick in ("tie", "tie-garbage", "tie-stop") and req.get("ignore_eos") and len(toks) > 1:
        honest, alt = toks[1], (toks[1] + 500) % 1000
        if args.trick == "tie-garbage":
            toks = [toks[0], alt] + [0] * (len(toks) - 2)
        elif args.trick == "tie-stop":
            toks = [toks[0], alt, 2]
        for t in toks if streaming else ():
            event(req, t)
        finish = "stop" if len(toks) < req["max_tokens"] else "length"
        send(reply(req, toks, tie=alt if args.trick == "tie" else honest, finish=finish))
        return
    if args.trick in ("eos-masked", "eos-emitted") and req.get("ignore_eos") and len(toks) > 1:
        out = reply(req, toks)
        k = len(out["top_logprobs"][1])
        if args.trick == "eos-emitted":
            toks[1] = 2
            out = reply(req, toks)
            out["top_logprobs"][1] = [[2, -0.05]] + [[(toks[2] if len(toks) > 2 else 7) + j, -3.0 - j]
                                                     for j in range(k - 1)]
        else:
            out["top_logprobs"][1] = [[2, -0.05], [toks[1], -0.1]] + out["top_logprobs"][1][1:k - 1]
        for t in toks if streaming else ():
            event(req, t)
        send(out)
        return
    if args.trick == "burst" and streaming:
        for t in toks:
            event(req, t)
        VT.pause(args.ttft + args.per_token * (len(toks) - 1))
        send(reply(req, toks))
        return
    first = args.ttft
    if args.trick == "slow-first":
        first = args.slow
    elif args.trick == "cache" and req["prompt_token_ids"] == previous:
        first = args.per_token  # the prefill is cached: only the first decode step is left
    for i, t in enumerate(toks):
        VT.pause(first if i == 0 else args.per_token)
        if streaming:
            event(req, 999 if args.trick == "event-ids" else t)
    send(reply(req, toks))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trick", required=True, choices=["burst", "event-ids", "zeros", "slow-first", "cache", "tie", "tie-garbage",
                                                      "tie-stop", "eos-masked", "eos-emitted"])
    ap.add_argument("--ttft", type=float, default=0.2)
    ap.add_argument("--per-token", type=float, default=0.05)
    ap.add_argument("--slow", type=float, default=1.5)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--hello-json", default="{}")
    ap.add_argument("--clock", default="")
    args = ap.parse_args()
    global VT
    VT = VirtualTime(args.clock)
    caps = ["generate", "stream"] if args.stream else ["generate"]
    send({"hello": "strict-gate/engine@1", "name": "hostile-speed-engine", "version": "1", "capabilities": caps,
          **json.loads(args.hello_json)})
    previous = None
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "shutdown":
            return
        serve(args, req, previous)
        previous = req["prompt_token_ids"]


if __name__ == "__main__":
    main()
