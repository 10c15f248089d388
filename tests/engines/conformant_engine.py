#!/usr/bin/env python
"""An engine that does everything docs/engine-protocol.md asks, for check-engine's tests.

The minimal engine's toy model (32 tokens, logits from the sum of the ids, exact ties between t
and t + 17), plus score, token events, ignore_eos, timing, the hello's facts, requests in
flight (max_in_flight 4, answered in turn), prefill_chunk (the toy has no prefill to split),
and dump with graft (at ops too): a one-layer toy (embed, layers.0.mlp.act = 2 x its input,
layers.0.mlp.down_proj = layers.0 = that + 1, norm, logits),
written as safetensors by hand (the engine needs nothing outside the standard library); the toy
has no cache, so its decode-path dump (`dump_decode`) is the same computation.
Computed in float64, so score and generate agree exactly. The tests/engines/check_*.py engines subclass
Conformant and break one thing each (tests/test_adversarial_check_engine.py).
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import time
from typing import ClassVar

VOCAB = 32
MODEL_EOS = [2]


def log_softmax(x: list[float]) -> list[float]:
    m = max(x)
    lse = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


def write_safetensors(path: str, tensors: dict[str, list[list[float]]]) -> None:
    header, blobs, at = {}, [], 0
    for name, rows in tensors.items():
        blob = struct.pack(f"<{sum(map(len, rows))}f", *(x for r in rows for x in r))
        header[name] = {"dtype": "F32", "shape": [len(rows), len(rows[0])], "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def read_safetensors(path: str) -> dict[str, list[list[float]]]:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    out = {}
    for name, meta in json.loads(data[8 : 8 + n]).items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        flat = struct.unpack(f"<{(b - a) // 4}f", data[8 + n + a : 8 + n + b])
        w = meta["shape"][1]
        out[name] = [list(flat[i : i + w]) for i in range(0, len(flat), w)]
    return out


class Conformant:
    capabilities: ClassVar[list[str]] = ["generate", "score", "stream", "dump", "graft", "graft_ops", "dump_decode", "prefill_chunk"]
    max_in_flight = 4

    def __init__(self) -> None:
        self.proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol keeps the real stdout
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    # -- the model
    def logprobs(self, ids: list[int]) -> list[float]:
        return log_softmax([float((sum(ids) * 7 + t * 13) % 17) / 4 for t in range(VOCAB)])

    def order(self, lp: list[float]) -> list[int]:
        return sorted(range(len(lp)), key=lambda t: (-lp[t], t))  # exact ties: the lowest id first

    def choose(self, lp: list[float], step: int) -> int:
        return self.order(lp)[0]

    def top(self, lp: list[float], k: int, chosen: int) -> list[list]:
        pairs = [[t, lp[t]] for t in self.order(lp)[:k]]
        return pairs if chosen in {t for t, _ in pairs} or not k else [*pairs, [chosen, lp[chosen]]]

    # -- the protocol
    def hello(self) -> dict:
        return {"hello": "strict-gate/engine@1", "name": "conformant", "version": "1.0",
                "capabilities": self.capabilities, "dtype": "float64", "eager": True, "kv_cache": "none",
                "prefix_cache": False, "max_context": 4096, "max_in_flight": self.max_in_flight}

    def send(self, obj: dict) -> None:
        self.proto.write(json.dumps(obj) + "\n")
        self.proto.flush()

    def eos(self, req: dict) -> set[int]:
        return set() if req.get("ignore_eos") else set(req.get("eos_token_ids") or MODEL_EOS)

    def finish(self, req: dict, toks: list[int], eos: set[int]) -> str:
        return "stop" if toks[-1] in eos else "length"

    def event(self, req: dict, tok: int, i: int, ids: list[int]) -> None:
        self.send({"event": "token", "id": req["id"], "token_id": tok})

    def timing(self, ttft: float, total: float) -> dict:
        return {"ttft_s": ttft, "total_s": total}

    def max_tokens(self, req: dict) -> int:
        return req["max_tokens"]

    def generate(self, req: dict) -> dict:
        t0 = time.perf_counter()
        ids = req["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise ValueError("prompt_token_ids must be a non-empty list of ids")
        k, eos, toks, tops, ttft = req["top_logprobs"], self.eos(req), [], [], 0.0
        prompt, ids = list(ids), list(ids)
        for step in range(self.max_tokens(req)):
            lp = self.logprobs(ids)
            tok = self.choose(lp, step)
            tops.append(self.top(lp, k, tok))
            toks.append(tok)
            ids.append(tok)
            if req.get("stream"):
                self.event(req, tok, step, prompt)
            ttft = ttft or time.perf_counter() - t0
            if tok in eos:
                break
        out = {"id": req["id"], "token_ids": toks, "finish_reason": self.finish(req, toks, eos),
               "timing": self.timing(ttft, time.perf_counter() - t0)}
        if k:
            out["top_logprobs"] = tops
        return out

    def score(self, req: dict) -> dict:
        ids, k, steps = list(req["prompt_token_ids"]), max(1, req["top_logprobs"]), []
        for tok in req["continuation_ids"]:
            lp = self.logprobs(ids)
            steps.append({"token_id": tok, "logprob": lp[tok], "top": self.top(lp, k, tok)[:k]})
            ids.append(tok)
        return {"id": req["id"], "steps": steps}

    def points(self, ids: list[int], graft: dict | None) -> dict[str, list[list[float]]]:
        """Every point at every position of the one-layer toy: its MLP's activated product
        (`mlp.act` = 2 x the input) and down projection (+ 1), fed from the graft where it has them."""
        embed = [[float(t), float(p), 1.0, 0.0] for p, t in enumerate(ids)]
        graft = graft or {}
        act = [[2 * x for x in row] for row in graft.get("embed", embed)]
        layer = [[x + 1 for x in row] for row in graft.get("layers.0.mlp.act", act)]
        return {"embed": embed, "layers.0.mlp.act": act, "layers.0.mlp.down_proj": layer, "layers.0": layer,
                "norm": [[x / 10 for x in row] for row in layer],
                "logits": [self.logprobs(ids[: p + 1]) for p in range(len(ids))]}

    def dump(self, req: dict) -> dict:
        graft = read_safetensors(req["graft"]) if req.get("graft") and "graft" in self.capabilities else None
        if graft and "graft_ops" not in self.capabilities:
            graft = {k: v for k, v in graft.items() if k.count(".") < 2}  # layer inputs only
        every = self.points(req["prompt_token_ids"], graft)
        names = [n for n in (req.get("points") or [n for n in every if n.count(".") < 2]) if n in every]
        path = os.path.join(req["directory"], "activations.safetensors")
        write_safetensors(path, {n: [every[n][p] for p in req["positions"]] for n in names})
        return {"id": req["id"], "path": path, "points": names}

    def answer(self, req: dict) -> dict:
        op = req.get("op")
        if op == "generate":
            return self.generate(req)
        if op == "score" and "score" in self.capabilities:
            return self.score(req)
        if op == "dump" and "dump" in self.capabilities:
            return self.dump(req)
        return {"id": req.get("id"), "error": f"unsupported op {op!r}"}

    def handle(self, line: str) -> None:
        req = json.loads(line)
        try:
            out = self.answer(req)
        except Exception as e:  # this request failed; keep serving
            out = {"id": req.get("id"), "error": f"{type(e).__name__}: {e}"}
        self.send(out)

    def serve(self) -> None:
        self.send(self.hello())
        for line in sys.stdin:
            if not line.endswith("\n"):
                break
            if not line.strip():
                continue
            if json.loads(line).get("op") == "shutdown":
                break
            self.handle(line)
        self.on_eof()

    def on_eof(self) -> None:
        pass

    def run(self) -> None:
        try:
            self.serve()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.proto.fileno())
        sys.exit(0)


if __name__ == "__main__":
    Conformant().run()
