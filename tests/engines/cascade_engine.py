#!/usr/bin/env python
"""A command engine (strict-gate/engine@1) over a toy language model whose distribution is a pure
function of the token prefix, so decoding and teacher-forced scoring agree exactly
(tests/test_adversarial_cascade.py).

    python cascade_engine.py ROLE [--flip J ...] [--garbage] [--off J] [--score-refuses] [--hide-argmax J]

ROLE `reference` decodes the model greedily. ROLE `candidate` decodes it too, except:
  --flip J         at generated position J it picks the reference's runner-up (the model has a
                   0.05-nat tie there: a near-tie), claiming a candidate gap of 0.05
  --garbage        after the first flip, every token is one the model ranks 4.9 nats below its argmax
  --off J          at position J a token the model ranks 2.0 nats below its argmax
  --hide-argmax J  its decode top-k at position J omits the reference's argmax
  --score-refuses  it declares `score` and answers every score request with an error
  --prefill-disagrees  its score op (prefill) ranks the reference's argmax 0.03 nats above its
                   own token at each flip, where its decode chose its own: a negative re-scored gap
  --lean J         at its flip J its decode lists the reference's argmax 0.0005 nats above its own
                   token (a greedy choice within the gate's 1e-3 tolerance), and so does its score op
  --stop J         it stops after position J (finish "stop") on the model's argmax there, an
                   ordinary token, not an end-of-sequence id: an early stop nothing judged
  --chosen-only    a greedy loop with no logits (docs/engine-protocol.md, "A greedy loop without
                   logits"): each step lists only the chosen token and its logprob, and it does
                   not declare `score`
  --no-logprobs    the same loop giving nothing but token ids: no "top_logprobs" at all
Both roles take --needs-key NAME: without a non-empty NAME in its environment it answers as a
server without its key would (a fallback model): its score op ranks every token it is given its
argmax at -0.1, so it vouches for whatever a candidate emitted.
Both roles take --eos-at J: the model's argmax at generated position J is the end-of-sequence
id EOS (2), where the role stops (finish "stop", the EOS included), as a real model ends.
Every token the candidate picks is its own top-1 in what it reports, so the run audit passes;
its score op answers from the same claims (the candidate's own view of its prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

TIE = 0.05
TIES = (2, 5)  # generated positions where the model's top-2 are 0.05 nats apart
EOS = 2
EOS_AT: set[int] = set()  # generated positions where the model's argmax is EOS (--eos-at)


def model(prefix: list[int], j: int) -> list[tuple[int, float]]:
    """The toy model's top-5 at generated position j after `prefix`, sorted: argmax a, runner-up b,
    a token 2 nats off, one 4.9 nats off, a filler."""
    a = (sum(prefix) * 31 + len(prefix) * 7) % 40 + 10
    margin = TIE if j in TIES else 3.0
    if j in EOS_AT:
        return [(EOS, -0.1), (a, -3.1), (a + 200, -4.1), (a + 300, -5.0), (a + 400, -7.0)]
    return [(a, -0.1), (a + 50, -0.1 - margin), (a + 200, -2.1), (a + 300, -5.0), (a + 400, -7.0)]


def candidate_top(prefix: list[int], j: int, a: argparse.Namespace, flipped: bool) -> list[tuple[int, float]]:
    """What the candidate claims at j: its chosen token first, the model's argmax 0.05 below."""
    top = model(prefix, j)
    argmax = top[0][0]
    if j in a.flip:
        chosen = top[1][0]
    elif a.garbage and flipped:
        chosen = top[3][0]
    elif j == a.off:
        chosen = top[2][0]
    else:
        return top
    if j in a.lean:
        return [(argmax, -0.0995), (chosen, -0.1)] + [(t + 1000, -8.0 - i) for i, (t, _) in enumerate(top[:3])]
    claimed = [(chosen, -0.1)] + ([] if j == a.hide_argmax else [(argmax, -0.1 - TIE)])
    return claimed + [(t + 1000, -8.0 - i) for i, (t, _) in enumerate(top[:5 - len(claimed)])]


def view(prompt: list[int], tokens: list[int], j: int, a: argparse.Namespace) -> list[tuple[int, float]]:
    prefix = prompt + tokens[:j]
    if a.role == "reference":
        return model(prefix, j)
    flipped = any(i in a.flip for i in range(j))
    return candidate_top(prefix, j, a, flipped)


def lp(top: list[tuple[int, float]], token: int) -> float:
    return next((v for t, v in top if t == token), -20.0)


def generate(req: dict, a: argparse.Namespace) -> dict:
    prompt, tokens, tops = list(req["prompt_token_ids"]), [], []
    for j in range(req["max_tokens"]):
        top = view(prompt, tokens, j, a)[: max(1, req.get("top_logprobs", 5))]
        tokens.append(top[1][0] if a.role == "candidate" and j in a.lean else top[0][0])
        tops.append([list(p) for p in top])
        if tokens[-1] == EOS or j == a.stop:
            break
    finish = "stop" if len(tokens) < req["max_tokens"] or tokens[-1] == EOS else "length"
    out = {"id": req["id"], "prompt_token_ids": prompt, "token_ids": tokens, "finish_reason": finish,
           "top_logprobs": [[[t, lp(top, t)]] for t, top in zip(tokens, tops)] if a.chosen_only else tops}
    if a.no_logprobs:
        del out["top_logprobs"]
    return out


def keyless(req: dict) -> dict:
    """The fallback model's scoring: every token given is its argmax."""
    k = max(1, req.get("top_logprobs", 5))
    return {"id": req["id"], "steps": [{"token_id": t, "logprob": -0.1, "top": [[t, -0.1]] + [
        [t + 7 + i, -0.15 - i] for i in range(k - 1)]} for t in req["continuation_ids"]]}


def score(req: dict, a: argparse.Namespace) -> dict:
    prompt, cont, k = list(req["prompt_token_ids"]), list(req["continuation_ids"]), req.get("top_logprobs", 5)
    if a.needs_key and not os.environ.get(a.needs_key):
        return keyless(req)
    steps = []
    for j, t in enumerate(cont):
        top = view(prompt, cont, j, a)
        if a.role == "candidate" and a.prefill_disagrees and j in a.flip:
            top = [top[1], (top[0][0], top[1][1] - 0.03), *top[2:]]
        steps.append({"token_id": t, "logprob": lp(top, t), "top": [list(p) for p in top[:k]]})
    return {"id": req["id"], "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["reference", "candidate"])
    ap.add_argument("--flip", type=int, action="append", default=[])
    ap.add_argument("--garbage", action="store_true")
    ap.add_argument("--off", type=int, default=None)
    ap.add_argument("--hide-argmax", type=int, default=None)
    ap.add_argument("--score-refuses", action="store_true")
    ap.add_argument("--prefill-disagrees", action="store_true")
    ap.add_argument("--stop", type=int, default=None)
    ap.add_argument("--lean", type=int, action="append", default=[])
    ap.add_argument("--eos-at", type=int, action="append", default=[])
    ap.add_argument("--needs-key", default=None)
    ap.add_argument("--chosen-only", action="store_true")
    ap.add_argument("--no-logprobs", action="store_true")
    a = ap.parse_args()
    EOS_AT.update(a.eos_at)
    scores = not (a.chosen_only or a.no_logprobs)
    send({"hello": "strict-gate/engine@1", "name": f"cascade-{a.role}", "version": "1", "model": "toy",
          "capabilities": ["generate", "score"] if scores else ["generate"], "versions": {}})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "shutdown":
            break
        if req.get("op") == "score":
            send({"id": req["id"], "error": "scoring refused"} if a.score_refuses else score(req, a))
        else:
            send(generate(req, a))


def send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
