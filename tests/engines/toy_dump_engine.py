#!/usr/bin/env python
"""A toy model (2 layers, width 8, 32 ids, float32) behind strict-gate/engine@1, honest or
hostile on purpose, for the localisation tests: it generates, scores and dumps activations at
the canonical points, along its prefill path or its decode path (a running-sum cache).

Each layer: attn = tanh(mean(x[0..t]) @ A), mlp = tanh((x + attn) @ M), out = x / 2 + attn + mlp;
then norm = x / rms(x), logits = 3 * norm @ P^T.

BUG (comma-separated): mlp1 (layer 1's M scaled by 3: up_proj), q1 (layer 1's query scaled: a
sub-point bug), down1 (layer 1's down projection scaled by 1.5), kv1 (a decode-only cache bug: from
decode step 2, layer 1's cached sum of queries drops the first; prefill, score and a prefill dump
stay honest). Its ops inside a layer: attn_norm (the identity), attn.q_proj, attn.core (the prefix
mean of the queries: the attention), attn.o_proj, mlp_norm (x + attn), mlp.up_proj, mlp.act,
mlp.down_proj; given when asked for.
MODE (comma-separated) hostile dumps: missing (leaves out layers.1.mlp and layers.1), copy (copies
the reference's dump out of the shared work directory), decoy (the file in a subdirectory, a
decoy beside it), subdir (the file in a subdirectory), rewrite (rewrites its files with
other values when it shuts down), positions (the rows of the position before each asked), ids
(the ids shifted by one), zeros, extra_layer (adds layers.7), wide (layers.0 twice as wide),
no_dump (no "dump" in the hello), decode (declares "dump_decode"), and, declaring it too:
decode_lies (answers a decode request with the prefill pass), decode_from_ignored (decodes from
the first id whatever decode_from says), decode_positions (answers a decode request with the rows
of the position before each asked), decode_copy (answers a decode request with the reference's
decode dump, copied). graft_ops (declares "graft" and "graft_ops" and honours them, along either
path), graft_ignored (declares them and ignores the graft file). FAIL_FIRST_ID=N: an error reply
to dumps whose first id is N. STARTED=FILE: appends a line when it starts.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

V, W, L = 32, 8, 2
BUGS = set(filter(None, os.environ.get("BUG", "").split(",")))
MODES = set(filter(None, os.environ.get("MODE", "").split(",")))
g = torch.Generator().manual_seed(0)
E = torch.randn(V, W, generator=g)
A = [torch.randn(W, W, generator=g) / W**0.5 * 3 for _ in range(L)]
M = [torch.randn(W, W, generator=g) / W**0.5 * 2 for _ in range(L)]
P = torch.randn(V, W, generator=g)
if "mlp1" in BUGS:
    M[1] = M[1] * 3


class Feed:
    """The graft file's rows fed in place of the model's own values: `embed` / `layers.{i-1}` as
    layer i's input ("graft"), op points where the next op reads them ("graft_ops"); `rows`
    picks the positions of the pass (every one in a prefill, one per decode step)."""

    def __init__(self, tensors: dict | None = None):
        self.t = tensors or {}

    def input(self, i: int, x: torch.Tensor, rows: slice) -> torch.Tensor:
        src = "embed" if i == 0 else f"layers.{i - 1}"
        return self.t[src][rows] if src in self.t else x

    def __call__(self, name: str, value: torch.Tensor, out: dict, rows: slice) -> torch.Tensor:
        out[name] = value  # the dump keeps the model's own value
        return self.t[name][rows] if name in self.t else value


def attn_in(i: int, x: torch.Tensor, feed: Feed, out: dict, rows: slice) -> torch.Tensor:
    """attn_norm (the identity here) and the query: what the attention's cache sums."""
    n = feed(f"layers.{i}.attn_norm", x, out, rows)
    return feed(f"layers.{i}.attn.q_proj", n * (3.0 if "q1" in BUGS and i == 1 else 1.0), out, rows)


def layer_out(i: int, x: torch.Tensor, core: torch.Tensor, feed: Feed, out: dict, rows: slice) -> torch.Tensor:
    core = feed(f"layers.{i}.attn.core", core, out, rows)
    attn = feed(f"layers.{i}.attn.o_proj", torch.tanh(core @ A[i]), out, rows)
    h = feed(f"layers.{i}.mlp_norm", x + attn, out, rows)
    up = feed(f"layers.{i}.mlp.up_proj", h @ M[i], out, rows)
    act = feed(f"layers.{i}.mlp.act", torch.tanh(up), out, rows)
    mlp = feed(f"layers.{i}.mlp.down_proj", act * (1.5 if "down1" in BUGS and i == 1 else 1.0), out, rows)
    out[f"layers.{i}.attn"], out[f"layers.{i}.mlp"] = attn, mlp
    out[f"layers.{i}"] = 0.5 * x + attn + mlp
    return out[f"layers.{i}"]


def head(x: torch.Tensor, out: dict) -> torch.Tensor:
    out["norm"] = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    out["logits"] = 3 * out["norm"] @ P.T
    return out["logits"]


def prefill(ids: list[int], feed: Feed | None = None) -> tuple[dict, list]:
    """Every position at once; the cache: each layer's running sum of its queries."""
    feed, rows = feed or Feed(), slice(0, len(ids))
    out: dict = {"embed": E[torch.tensor(ids)]}
    x, cache = out["embed"], []
    n = torch.arange(1, len(ids) + 1, dtype=torch.float32)[:, None]
    for i in range(L):
        x = feed.input(i, x, rows)
        q = attn_in(i, x, feed, out, rows)
        cache.append(q.sum(0))
        x = layer_out(i, x, q.cumsum(0) / n, feed, out, rows)
    head(x, out)
    return out, cache


def step(tok: int, t: int, cache: list, k: int, feed: Feed) -> dict:
    """One id at position t through the cache (decode step k, from 0)."""
    out: dict = {"embed": E[tok][None]}
    x, rows = out["embed"], slice(t, t + 1)
    for i in range(L):
        x = feed.input(i, x, rows)
        q = attn_in(i, x, feed, out, rows)
        cache[i] = cache[i] + q[0]
        s = cache[i] - (first[i] if "kv1" in BUGS and i == 1 and k >= 2 else 0)
        x = layer_out(i, x, (s / (t + 1))[None], feed, out, rows)
    head(x, out)
    return out


first: list = []


def decode_rows(ids: list[int], start: int, feed: Feed | None = None) -> dict:
    """Prefill ids[:start], then the rest one at a time: every point's row per position."""
    global first
    feed = feed or Feed()
    rows, cache = prefill(ids[:start], feed)
    first = [rows[f"layers.{i}.attn.q_proj"][0] for i in range(L)]
    rows = {k: list(v) for k, v in rows.items()}
    for k, t in enumerate(range(start, len(ids))):
        for name, v in step(ids[t], t, cache, k, feed).items():
            rows[name].append(v[0])
    return {k: torch.stack(v) for k, v in rows.items()}


def generate(req: dict) -> dict:
    ids = list(req["prompt_token_ids"])
    k = req.get("top_logprobs", 1)
    toks, tops = [], []
    logits = decode_rows(ids, len(ids))["logits"][-1]
    for _ in range(req["max_tokens"]):
        lp = torch.log_softmax(logits.double(), -1)
        tok = int(lp.argmax())
        top = torch.topk(lp, k)
        toks.append(tok)
        tops.append([[int(a), float(b)] for a, b in zip(top.indices, top.values)])
        logits = decode_rows(ids + toks, len(ids))["logits"][-1]
    return {"id": req["id"], "prompt_token_ids": ids, "token_ids": toks, "finish_reason": "length",
            "top_logprobs": tops}


def score(req: dict) -> dict:
    ids, cont, k = list(req["prompt_token_ids"]), list(req["continuation_ids"]), req.get("top_logprobs", 1)
    lp = torch.log_softmax(prefill(ids + cont)[0]["logits"].double(), -1)
    steps = []
    for j, tok in enumerate(cont):
        row = lp[len(ids) + j - 1]
        top = torch.topk(row, k)
        steps.append({"token_id": tok, "logprob": float(row[tok]),
                      "top": [[int(a), float(b)] for a, b in zip(top.indices, top.values)]})
    return {"id": req["id"], "steps": steps}


written: list[Path] = []


def dump(req: dict) -> dict:
    ids, pos, d = list(req["prompt_token_ids"]), list(req["positions"]), Path(req["directory"])
    if os.environ.get("FAIL_FIRST_ID") and ids[0] == int(os.environ["FAIL_FIRST_ID"]):
        return {"id": req["id"], "error": "this engine cannot dump this prompt"}
    if "ids" in MODES:
        ids = [(t + 1) % V for t in ids]
    if "positions" in MODES:
        pos = [max(0, p - 1) for p in pos]
    asked_decode = req.get("mode") == "decode"
    decode = asked_decode and "decode_lies" not in MODES
    if asked_decode and "decode_positions" in MODES:
        pos = [max(0, p - 1) for p in pos]
    feed = Feed(load_file(req["graft"]) if req.get("graft") and "graft_ignored" not in MODES else None)
    start = 1 if "decode_from_ignored" in MODES else req.get("decode_from")
    rows = decode_rows(ids, start, feed) if decode else prefill(ids, feed)[0]
    layer_level = [k for k in rows if k.count(".") < 2 or k.endswith((".attn", ".mlp"))]  # ops only when asked
    kept = {k: rows[k][pos].float().contiguous() for k in req.get("points") or layer_level if k in rows}
    if "missing" in MODES:
        kept = {k: v for k, v in kept.items() if k not in ("layers.1.mlp", "layers.1")}
    if "zeros" in MODES:
        kept = {k: torch.zeros_like(v) for k, v in kept.items()}
    if "extra_layer" in MODES:
        kept["layers.7"] = torch.ones(len(pos), W)
    if "wide" in MODES and "layers.0" in kept:
        kept["layers.0"] = torch.cat([kept["layers.0"]] * 2, 1)
    path = d / ("sub" if {"decoy", "subdir"} & MODES else "") / "activations.safetensors"
    path.parent.mkdir(exist_ok=True)
    save_file(kept, str(path))
    if "decoy" in MODES:
        save_file({k: v * 0.5 for k, v in kept.items()}, str(d / "decoy.safetensors"))
    if asked_decode and "decode_copy" in MODES:  # the reference's decode dump of the same ids
        for src in sorted((d.parent.parent / "reference").glob("*-decode/activations.safetensors")):
            if "embed" in kept and torch.equal(load_file(str(src)).get("embed", torch.zeros(0)), kept["embed"]):
                shutil.copyfile(src, path)
                kept = load_file(str(path))
                break
    if "copy" in MODES:
        source = d.parent.parent / "reference" / d.name / "activations.safetensors"  # the same request's
        shutil.copyfile(source, path)
        kept = load_file(str(path))
    written.append(path)
    return {"id": req["id"], "path": str(path), "points": sorted(kept)}


def rewrite() -> None:
    for path in written:
        if path.is_file():
            save_file({k: v * 0 + 1 for k, v in load_file(str(path)).items()}, str(path))


def main() -> None:
    if os.environ.get("STARTED"):
        with open(os.environ["STARTED"], "a") as f:
            f.write("started\n")
    caps = ["generate", "score"] + ([] if "no_dump" in MODES else ["dump"])
    caps += ["dump_decode"] if {"decode", "decode_lies", "decode_from_ignored", "decode_positions",
                                "decode_copy"} & MODES else []
    caps += ["graft", "graft_ops"] if {"graft_ops", "graft_ignored"} & MODES else []
    print(json.dumps({"hello": "strict-gate/engine@1", "capabilities": caps, "dtype": "float32",
                      "name": "toy"}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "shutdown":
            break
        reply = {"generate": generate, "score": score, "dump": dump}[op](req)
        print(json.dumps(reply), flush=True)
    if "rewrite" in MODES:
        rewrite()


if __name__ == "__main__":
    main()
