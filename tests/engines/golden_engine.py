#!/usr/bin/env python
"""A command engine (strict-gate/engine@1) over a toy model whose distribution is a pure function
of the token prefix, for the golden's tests (tests/test_adversarial_golden.py).

    python golden_engine.py NAME [--off J] [--gap G] [--score-refuses] [--no-score] [--score-short]

NAME only names it (a golden and a clean arm are then two configs). Without flags it decodes the
model greedily and scores from it: the golden's truth. With:
  --off J          at generated position J it emits the token the model ranks G nats below its
                   argmax, claiming it as its own top-1 and the argmax G nats below it (its decode
                   and its score op agree: the run audit passes and the gate sees the divergence)
  --gap G          the model's runner-up sits G nats below its argmax (default 2.0: a real divergence)
  --score-refuses  it declares `score` and answers every score request with an error
  --no-score       its hello declares no `score`
  --score-short    its score op answers one step fewer than it was asked
"""

from __future__ import annotations

import argparse
import json
import sys


def model(prefix: list[int], gap: float) -> list[tuple[int, float]]:
    """The toy model's top-5 after `prefix`, sorted: argmax a, the runner-up a + 100 `gap` nats off, fillers."""
    a = (sum(prefix) * 31 + len(prefix) * 7) % 40 + 10
    return [(a, -0.1), (a + 100, -0.1 - gap), (a + 200, -4.0), (a + 300, -5.0), (a + 400, -6.0)]


def view(prompt: list[int], tokens: list[int], j: int, a: argparse.Namespace) -> list[tuple[int, float]]:
    top = model(prompt + tokens[:j], a.gap)
    if j == a.off:
        return [(top[1][0], top[0][1]), (top[0][0], top[1][1]), *top[2:]]
    return top


def generate(req: dict, a: argparse.Namespace) -> dict:
    prompt, tokens, tops = list(req["prompt_token_ids"]), [], []
    for j in range(req["max_tokens"]):
        top = view(prompt, tokens, j, a)[: max(1, req.get("top_logprobs", 5))]
        tokens.append(top[0][0])
        tops.append([list(p) for p in top])
    return {"id": req["id"], "prompt_token_ids": prompt, "token_ids": tokens, "finish_reason": "length",
            "top_logprobs": tops}


def score(req: dict, a: argparse.Namespace) -> dict:
    prompt, cont, k = list(req["prompt_token_ids"]), list(req["continuation_ids"]), req.get("top_logprobs", 5)
    steps = []
    for j, t in enumerate(cont):
        top = view(prompt, cont, j, a)
        steps.append({"token_id": t, "logprob": next((v for u, v in top if u == t), -20.0),
                      "top": [list(p) for p in top[:k]]})
    return {"id": req["id"], "steps": steps[:-1] if a.score_short else steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--off", type=int, default=None)
    ap.add_argument("--gap", type=float, default=2.0)
    ap.add_argument("--score-refuses", action="store_true")
    ap.add_argument("--no-score", action="store_true")
    ap.add_argument("--score-short", action="store_true")
    a = ap.parse_args()
    caps = ["generate"] if a.no_score else ["generate", "score"]
    send({"hello": "strict-gate/engine@1", "name": f"golden-toy-{a.name}", "version": "1", "model": "toy",
          "capabilities": caps, "versions": {}})
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
