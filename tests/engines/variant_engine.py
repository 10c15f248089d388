#!/usr/bin/env python
"""A command engine for the invariance tests: batch-invariant, or batch-dependent on purpose.

    python variant_engine.py [--mode MODE] [--max-in-flight N] [--gap G] [--no-chunk] [--no-cache]

It reads every request already waiting on stdin before it answers (so requests the gate keeps
in flight really are served together), and answers a group in reverse order (so the gate must
match replies by id). Token i of a prompt is a function of the prompt alone:
(sum(ids) * 31 + 7 * i) % 1000 + 1, its logprob -0.1, the runner-up (token + 1) G nats below.

Modes (what makes the tokens move, or the protocol break):
  invariant   nothing: the tokens never depend on how the prompt was served
  in_flight   token 2 is the runner-up when more than one request is served together
  chunk       token 2 is the runner-up when a "prefill_chunk" shorter than the prompt is asked for
  cache       token 2 is the runner-up when the prompt's prefix was served before (a cache hit)
  stray_id    answers the second request of a group with an id that was never sent
  extra       answers the first request of a group twice (more replies than requests)
  refuse      declares max_in_flight but, given more than one request at once, never answers
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys

VOCAB = 1000


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def tokens(req: dict, moved: bool, gap: float) -> dict:
    ids = req["prompt_token_ids"]
    k = max(1, req.get("top_logprobs", 1))
    toks, tops = [], []
    for i in range(req["max_tokens"]):
        best = (sum(ids) * 31 + 7 * i) % VOCAB + 1
        runner = best + 1
        chosen = runner if moved and i == 2 else best
        other = best if chosen == runner else runner
        top = [[chosen, -0.1], [other, -0.1 - gap]] + [[VOCAB + 10 + j, -9.0 - j] for j in range(max(0, k - 2))]
        toks.append(chosen)
        tops.append(top[:k] if k >= 2 else top[:1])
    return {"id": req["id"], "token_ids": toks, "finish_reason": "length", "top_logprobs": tops}


def read_group(stdin) -> list[dict] | None:
    """One line, blocking, then every line already waiting (what is in flight right now)."""
    line = stdin.readline()
    if not line:
        return None
    group = [json.loads(line)] if line.strip() else []
    while select.select([stdin], [], [], 0.05)[0]:
        more = stdin.readline()
        if not more:
            break
        if more.strip():
            group.append(json.loads(more))
    return group


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="invariant")
    ap.add_argument("--max-in-flight", type=int, default=8)
    ap.add_argument("--gap", type=float, default=3.0)
    ap.add_argument("--no-chunk", action="store_true")
    ap.add_argument("--no-cache", action="store_true")
    args = ap.parse_args()
    caps = ["generate"] + ([] if args.no_chunk else ["prefill_chunk"])
    send({"hello": "strict-gate/engine@1", "name": "variant-engine", "version": "1", "capabilities": caps,
          "max_in_flight": args.max_in_flight, "prefix_cache": not args.no_cache, "pid": os.getpid()})
    seen: set[tuple[int, ...]] = set()
    stdin = sys.stdin
    while True:
        group = read_group(stdin)
        if group is None:
            return 0
        if any(r.get("op") == "shutdown" for r in group):
            return 0
        if args.mode == "refuse" and len(group) > 1:
            while stdin.readline():
                pass
            return 0
        replies = []
        for n, req in enumerate(group):
            ids = tuple(req["prompt_token_ids"])
            chunk = req.get("prefill_chunk")
            moved = {"in_flight": len(group) > 1,
                     "chunk": bool(chunk) and chunk < len(ids),
                     "cache": any(len(s) >= 2 and ids[: len(s)] == s for s in seen)}.get(args.mode, False)
            seen.add(ids)
            reply = tokens(req, moved, args.gap)
            if args.mode == "stray_id" and n == 1:
                reply["id"] = "never-sent"
            replies.append(reply)
            if args.mode == "extra" and n == 0 and len(group) > 1:
                replies.append(dict(reply))
        for reply in reversed(replies):
            send(reply)


if __name__ == "__main__":
    sys.exit(main())
