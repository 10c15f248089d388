#!/usr/bin/env python
"""A minimal engine speaking strict-gate/engine@1 (docs/engine-protocol.md: the messages are its
section 4, and this file is printed in its section 8).

Replace forward_last_logits with your model's forward pass; the rest is the required protocol
(score, token events and ignore_eos are optional: sections 4 and 5). The toy model (32 tokens,
logits from the sum of the ids) is only there so that this file runs; `strict-gate check-engine`
passes it (section 9)."""
import json
import math
import os
import sys

proto = os.fdopen(os.dup(1), "w", buffering=1)   # the protocol keeps the real stdout...
os.dup2(2, 1); sys.stdout = sys.stderr            # ...and stray prints go to stderr

MODEL_EOS = [2]   # your generation_config.json eos_token_id: used when a request has no eos_token_ids
device_kda = os.environ.get("DEVICE_KDA", "0") == "1"   # env switches arrive as env vars


def forward_last_logits(ids):          # your model: the float32 logits of the next token
    return [float((sum(ids) * 7 + t * 13) % 17) / 4 for t in range(32)]


def log_softmax(x):                    # in float32 or float64; the gate allows 1e-6 above 0
    m = max(x); lse = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


def send(obj):
    proto.write(json.dumps(obj) + "\n"); proto.flush()


def generate(req):
    eos = set(req.get("eos_token_ids") or MODEL_EOS)
    k, ids, toks, tops = req["top_logprobs"], list(req["prompt_token_ids"]), [], []
    for _ in range(req["max_tokens"]):
        lp = log_softmax(forward_last_logits(ids))
        order = sorted(range(len(lp)), key=lambda t: (-lp[t], t))   # exact ties: the lowest id first
        tok = order[0]                                              # greedy: the argmax
        tops.append([[t, lp[t]] for t in order[:k]])                # the chosen token is order[0]
        toks.append(tok); ids.append(tok)
        if tok in eos:
            break                                                   # the EOS is part of token_ids
    out = {"id": req["id"], "token_ids": toks, "finish_reason": "stop" if toks[-1] in eos else "length"}
    if k:
        out["top_logprobs"] = tops
    return out


def serve():
    send({"hello": "strict-gate/engine@1", "name": "my-engine", "version": "0.1",
          "capabilities": ["generate"], "settings": {"DEVICE_KDA": device_kda}})
    for line in sys.stdin:             # EOF: the gate closed stdin (or died); stop
        if not line.endswith("\n"):
            break                      # a torn last line: the gate died while writing it
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "shutdown":
            break
        if req.get("op") != "generate":  # score, or an op of a later protocol version
            send({"id": req.get("id"), "error": f"unsupported op {req.get('op')!r}"})
            continue
        try:
            out = generate(req)
        except Exception as e:         # this prompt failed; keep serving
            out = {"id": req["id"], "error": f"{type(e).__name__}: {e}"}
        send(out)


try:
    serve()
except BrokenPipeError:                # the gate is gone: nobody to answer, nothing to report
    os.dup2(os.open(os.devnull, os.O_WRONLY), proto.fileno())   # so the exit flush is quiet too
sys.exit(0)
