#!/usr/bin/env python
"""The conformant engine (generate, score, stream, dump, requests in flight) that logs its
configuration, as a careless engine does, for the secret tests: it echoes the secret wherever an
engine can.

    python config_engine.py [--echo NAME]... [--places P,...] [--error-id ID] [--diverge ID]
                            [--delay S] [--pidfile F]

Its configuration is its argv and each --echo variable's value. Places (all by default):
  stderr   printed at start, and before each error reply (into engine.log)
  hello    in the hello's "versions"
  error    quoted in the error reply to prompt --error-id and to an op it does not know
--diverge ID: prompt ID's second token is another one (a divergent prompt). Each generate request
is answered after S seconds (a test signals the gate meanwhile). --pidfile appends its pid.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from conformant_engine import VOCAB, Conformant, log_softmax

PLACES = ("stderr", "hello", "error")


class ConfigEngine(Conformant):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.places = set(args.places.split(","))
        self.diverging, self.prompt_len = False, 0
        self.config = {name: os.environ.get(name, "") for name in args.echo}
        self.log(f"argv {sys.argv!r} env {self.config!r}")

    def log(self, text: str) -> None:
        if "stderr" in self.places:
            print(f"config-engine: {text}", file=sys.stderr, flush=True)

    def said(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.items()) if "error" in self.places else "(not said)"

    def hello(self) -> dict:
        versions = dict(self.config) if "hello" in self.places else {}
        return super().hello() | {"name": "config-engine", "versions": versions}

    def logprobs(self, ids: list[int]) -> list[float]:
        """Another model for prompt --diverge at its second token: greedy on its own logits."""
        lp = super().logprobs(ids)
        if self.diverging and len(ids) == self.prompt_len + 1:
            lp[(self.order(lp)[0] + 5) % VOCAB] += 3.0
            lp = log_softmax(lp)
        return lp

    def answer(self, req: dict) -> dict:
        self.diverging = req.get("op") == "generate" and req.get("id") == self.args.diverge
        self.prompt_len = len(req.get("prompt_token_ids") or ())
        if req.get("op") == "generate":
            time.sleep(self.args.delay)
            if req.get("id") == self.args.error_id:
                self.log(f"refusing {req['id']} under {self.config!r}")
                return {"id": req["id"], "error": f"out of memory with config {self.said()}"}
        if req.get("op") not in ("generate", "score", "dump"):
            return {"id": req.get("id"), "error": f"unknown op {req.get('op')!r} (config {self.said()})"}
        return super().answer(req)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--echo", action="append", default=[])
    ap.add_argument("--places", default=",".join(PLACES))
    ap.add_argument("--error-id", default=None)
    ap.add_argument("--diverge", default=None)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--pidfile", default=None)
    args = ap.parse_args()
    if args.pidfile:
        with open(args.pidfile, "a") as f:
            f.write(f"{os.getpid()}\n")
    ConfigEngine(args).run()


if __name__ == "__main__":
    main()
