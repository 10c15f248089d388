#!/usr/bin/env python
"""A command engine for the speculative-decoding tests: honest, or hostile on purpose.

    python spec_engine.py [--mode MODE] [--gap G]

Token i of a prompt is a function of the prompt alone: (sum(ids) * 31 + 7 * i) % 1000 + 1, its
logprob -0.1, the runner-up (token + 1) G nats below. A generate request carrying
"speculative": {"method", "num_speculative_tokens": K} is answered with counts
{"drafted", "accepted", "drafts"} where the mode says so.

Modes:
  honest       declares "speculative"; the same tokens; plausible counts (K drafted per step)
  undeclared   no "speculative" capability (the gate must not ask, and must not pass the variant)
  silent       declares it and ignores it: the same tokens, no counts (acceptance unknown)
  idle         declares it and ignores it, saying so: counts of 0 drafted
  lie          declares it; counts that no run could have (accepted > drafted)
  overclaim    declares it; more accepted drafts than tokens emitted after the first
  some         speculates (counts, and a near-tie flipped at token 2) on every other request only
  unasked      sends counts on plain requests too (it speculates when nobody asked)
  lossy        speculates and accepts a draft the verifier ranks G nats below its argmax at token
               2 (a lossy acceptance rule), its logprobs the verifier's: honest counts
  lossy-claimed  the same draft accepted, its logprobs claiming the draft as the top-1
"""

from __future__ import annotations

import argparse
import json
import sys

VOCAB = 1000


def send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def reply(req: dict, gap: float, flip: bool, lossy: str | None = None) -> dict:
    ids = req["prompt_token_ids"]
    k = max(1, req.get("top_logprobs", 1))
    toks, tops = [], []
    for i in range(req["max_tokens"]):
        best = (sum(ids) * 31 + 7 * i) % VOCAB + 1
        chosen = best + 1 if (flip or lossy) and i == 2 else best
        other = best if chosen != best else best + 1
        top = [[chosen, -0.1], [other, -0.1 - gap]] + [[VOCAB + 10 + j, -9.0 - j] for j in range(max(0, k - 2))]
        if lossy == "lossy" and i == 2:  # the verifier's own logprobs: its argmax above the accepted draft
            top = [[best, -0.1], [chosen, -0.1 - gap]] + top[2:]
        toks.append(chosen)
        tops.append(top[:k])
    return {"id": req["id"], "token_ids": toks, "finish_reason": "length", "top_logprobs": tops}


def counts(mode: str, n: int, k: int) -> dict | None:
    steps = max(n - 1, 0) // 2  # a verification every other token, K drafted each, half of them accepted
    honest = {"drafted": k * steps, "accepted": min(steps, max(n - 1, 0)), "drafts": steps}
    return {"honest": honest, "some": honest, "unasked": honest, "silent": None, "lossy": honest,
            "lossy-claimed": honest,
            "idle": {"drafted": 0, "accepted": 0},
            "lie": {"drafted": 1, "accepted": 2},
            "overclaim": {"drafted": k * n, "accepted": n}}.get(mode)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="honest")
    ap.add_argument("--gap", type=float, default=0.01)
    args = ap.parse_args()
    caps = ["generate"] + ([] if args.mode == "undeclared" else ["speculative"])
    send({"hello": "strict-gate/engine@1", "name": "spec-engine", "version": "1", "capabilities": caps})
    for served, line in enumerate(sys.stdin, start=1):
        req = json.loads(line)
        if req.get("op") == "shutdown":
            return 0
        spec = req.get("speculative")
        speculating = spec is not None and (args.mode != "some" or served % 2 == 0)
        lossy = args.mode if speculating and args.mode.startswith("lossy") else None
        out = reply(req, args.gap, flip=speculating and args.mode == "some", lossy=lossy)
        k = spec["num_speculative_tokens"] if spec else 3
        c = counts(args.mode, len(out["token_ids"]), k) if speculating or args.mode == "unasked" else None
        if c is not None:
            out["speculative"] = c
        send(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
