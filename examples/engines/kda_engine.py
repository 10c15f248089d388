#!/usr/bin/env python
"""An example candidate engine for strict-gate: a Kimi-Linear (KDA + MLA) model, served over
the command protocol (strict-gate/engine@1: JSON lines on stdin/stdout, docs/engine-protocol.md).

It plays the seed team's C++ port in miniature. It loads a Kimi-Linear checkpoint with
transformers and runs its own greedy loop (prompt pass, then one token per step against a
KV cache for the MLA layer and conv + recurrent state for the KDA layers), honouring the
port's switches, read from the environment:

  DEVICE_KDA=1 (default)        the "device" KDA path, where chunk prefill exists.
  KDA_CHUNK_PREFILL=1 (default) with DEVICE_KDA=1: the prompt goes through the CHUNKED KDA
                                form (chunk_kimi_delta_attention) and decode through the
                                recurrent form, the same split as vLLM (and transformers).
  KDA_CHUNK_PREFILL=0           the prompt goes through the RECURRENT form token by token
                                (a different reduction order: what the port did before it
                                gained chunk prefill).
  DEVICE_KDA=0                  the "host" reference path of the port: recurrent everywhere
                                (chunk prefill is a device feature; asking for it here is
                                refused with a clear error).
  KDA_DTYPE / --dtype           bfloat16 (default), float32 or float16.
  KDA_THREADS / --threads       torch CPU threads (default: torch's default).

How the switch is implemented (an example, not a port): transformers' KimiLinearDeltaAttention
calls the module-level function `chunk_kimi_delta_attention` for every multi-token pass and
`recurrent_kimi_delta_attention` for single-token decode with a cache. This script
MONKEYPATCHES the module-level `chunk_kimi_delta_attention` of
transformers.models.kimi_linear.modeling_kimi_linear with a dispatcher that calls the
recurrent form instead when the recurrent prefill is selected. Decode is untouched. Logprobs
are log_softmax of the raw logits in float32; greedy picks the argmax of the float32 logits
(as transformers' generate does). Score requests are one forward pass over prompt +
continuation, through the same prefill form.

Measured on examples/models/tiny-kimi-linear (random weights, 4 layers, CPU, 1 thread),
2 x 32 random prompts of 8-80 ids, 16 greedy tokens, against strict-gate's `hf` engine:
with chunk prefill the tokens AND top-5 logprobs are bitwise equal to transformers'
generate (64/64 prompts, bf16 and fp32). With KDA_CHUNK_PREFILL=0 the first-step logits
move by up to 4.2e-7 (fp32, every prompt) or one bf16 step, 0.0078 (bf16, 23 of 64 prompts);
greedy tokens flipped on 4 of 64 prompts in bf16 (all at exact or one-ulp ties) and on none
in fp32: the seed's phenomenon in miniature.

Serving variants (strict-gate's [invariance], docs/engine-protocol.md section 5): the hello
declares "max_in_flight" (--max-in-flight, default 8) and the capability "prefill_chunk". The
engine reads every request already waiting before it answers; generate requests waiting
together (same max_tokens, top_logprobs and prefill_chunk) run as ONE batch: left padding with
the attention mask (transformers zeroes padded states before the KDA conv and recurrence) and
position ids counted from each row's first real token. A "prefill_chunk": C request feeds the
prompt C tokens per forward pass, the recurrent state and the MLA cache carried between the
pieces; each piece goes through the multi-token KDA form chosen above. A single request with
no prefill_chunk takes exactly the unbatched path described above (no mask, no position ids),
so batch 1 is what it always was.

stdout carries only protocol lines: the real stdout is kept on a private descriptor and fd 1
is pointed at stderr, so prints and library banners cannot corrupt the stream.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
import traceback
from pathlib import Path

PROTOCOL = "strict-gate/engine@1"
NAME = "kda-example"
VERSION = "0.1.0"
DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny-kimi-linear"


def protocol_stdout():
    """Keep the real stdout for protocol lines; anything else printed goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def env_flag(name: str, default: str) -> bool:
    v = os.environ.get(name, default).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise SystemExit(f"{name}={v!r}: expected 0 or 1")


class KDAEngine:
    def __init__(self, model_dir: str, dtype: str, prefill: str):
        import torch
        from transformers import KimiLinearForCausalLM
        from transformers.models.kimi_linear import modeling_kimi_linear as mkl

        self.torch = torch
        self.prefill = prefill  # "chunk" | "recurrent"
        self.calls = {"chunk": 0, "recurrent_prefill": 0, "batches": 0, "batched_requests": 0}
        chunk_fn = mkl.chunk_kimi_delta_attention
        recurrent_fn = mkl.recurrent_kimi_delta_attention
        engine = self

        def kda_prompt_pass(query, key, value, g, beta, chunk_size=64, initial_state=None,
                            output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
            """The multi-token KDA pass: chunked (vLLM's prefill) or recurrent (the old port)."""
            if engine.prefill == "recurrent":
                engine.calls["recurrent_prefill"] += 1
                return recurrent_fn(query, key, value, g=g, beta=beta, initial_state=initial_state,
                                    output_final_state=output_final_state,
                                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
            engine.calls["chunk"] += 1
            return chunk_fn(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)

        mkl.chunk_kimi_delta_attention = kda_prompt_pass  # the monkeypatch (see the module docstring)

        self.dtype = dtype
        self.model = KimiLinearForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        self.config = self.model.config
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.config.eos_token_id
        self.eos = set(eos) if isinstance(eos, (list, tuple)) else ({int(eos)} if eos is not None else set())
        self.vocab = self.config.vocab_size

    def _check_ids(self, ids, what):
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{what} must be a list of integers")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"{what} holds ids outside the vocabulary (size {self.vocab}): {bad[:5]}")

    def _top(self, logits_f32, k: int, chosen: int):
        torch = self.torch
        lp = torch.log_softmax(logits_f32, dim=-1)
        pairs = []
        if k > 0:
            v, i = torch.topk(lp, min(k, lp.shape[-1]))
            pairs = [[int(t), float(x)] for t, x in zip(i.tolist(), v.tolist())]
        if chosen not in {t for t, _ in pairs}:
            pairs.append([chosen, float(lp[chosen])])
        return pairs

    def generate(self, req: dict) -> dict:
        from transformers import DynamicCache

        torch = self.torch
        ids = req.get("prompt_token_ids")
        self._check_ids(ids, "prompt_token_ids")
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        max_tokens = int(req.get("max_tokens", 16))
        k = int(req.get("top_logprobs", 0))
        eos = set(req["eos_token_ids"]) if req.get("eos_token_ids") is not None else self.eos  # section 4: the request's ids win
        stop_on_eos = not req.get("ignore_eos", False)  # the speed arm times exactly max_tokens tokens
        t0 = time.perf_counter()
        ttft = None
        toks, tops = [], []
        with torch.inference_mode():
            cache = DynamicCache(config=self.config)
            x = torch.tensor([ids])
            for step in range(max_tokens):
                out = self.model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache = out.past_key_values
                logits = out.logits[0, -1].float()
                tok = int(torch.argmax(logits))
                toks.append(tok)
                tops.append(self._top(logits, k, tok))
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if stop_on_eos and tok in eos:
                    break
                x = torch.tensor([[tok]])
        total = time.perf_counter() - t0
        return {
            "id": req["id"],
            "prompt_token_ids": ids,
            "token_ids": toks,
            "finish_reason": "stop" if stop_on_eos and toks and toks[-1] in eos else "length",
            "top_logprobs": tops,
            "timing": {"ttft_s": ttft, "total_s": total},
        }

    def generate_group(self, reqs: list[dict]) -> list[dict]:
        """Requests served together: one batch (or, alone and unchunked, the path above)."""
        if len(reqs) == 1 and not reqs[0].get("prefill_chunk"):
            return [self.generate(reqs[0])]
        return self._batched(reqs)

    def _batched(self, reqs: list[dict]) -> list[dict]:
        from transformers import DynamicCache

        torch = self.torch
        for r in reqs:
            self._check_ids(r.get("prompt_token_ids"), "prompt_token_ids")
            if not r["prompt_token_ids"]:
                raise ValueError("prompt_token_ids is empty")
        max_tokens, k = int(reqs[0].get("max_tokens", 16)), int(reqs[0].get("top_logprobs", 0))
        chunk = int(reqs[0].get("prefill_chunk") or 0)
        if chunk < 0:
            raise ValueError("prefill_chunk must be >= 0")
        width = max(len(r["prompt_token_ids"]) for r in reqs)
        pad = min(self.eos) if self.eos else 0
        ids = torch.tensor([[pad] * (width - len(r["prompt_token_ids"])) + r["prompt_token_ids"] for r in reqs])
        mask = torch.tensor([[0] * (width - len(r["prompt_token_ids"])) + [1] * len(r["prompt_token_ids"])
                             for r in reqs])
        padded = bool((mask == 0).any())
        self.calls["batches"] += 1
        self.calls["batched_requests"] += len(reqs)
        t0 = time.perf_counter()
        toks = [[] for _ in reqs]
        tops = [[] for _ in reqs]
        done = [False] * len(reqs)
        eos = [set(r["eos_token_ids"]) if r.get("eos_token_ids") is not None else self.eos for r in reqs]
        stops = [not r.get("ignore_eos", False) for r in reqs]  # as generate(): the request's ids, ignore_eos
        with torch.inference_mode():
            cache = DynamicCache(config=self.config)
            step = chunk or width
            for start in range(0, width, step):  # the prompt, `step` columns per forward pass
                out = self._forward(ids[:, start : start + step], mask[:, : start + step], cache, padded)
            for n in range(max_tokens):
                logits = out.logits[:, -1].float()
                nxt = torch.argmax(logits, dim=-1)
                for b, tok in enumerate(nxt.tolist()):
                    if not done[b]:
                        toks[b].append(tok)
                        tops[b].append(self._top(logits[b], k, tok))
                        done[b] = stops[b] and tok in eos[b]
                if all(done) or n == max_tokens - 1:
                    break
                mask = torch.cat([mask, torch.ones(len(reqs), 1, dtype=mask.dtype)], dim=1)
                out = self._forward(nxt[:, None], mask, cache, padded)
        total = time.perf_counter() - t0
        return [{"id": r["id"], "prompt_token_ids": r["prompt_token_ids"], "token_ids": t,
                 "finish_reason": "stop" if stop and t and t[-1] in e else "length", "top_logprobs": tp,
                 "timing": {"total_s": total}} for r, t, tp, e, stop in zip(reqs, toks, tops, eos, stops)]

    def _forward(self, x, mask, cache, padded: bool):
        """One forward pass of `x` after what `cache` holds; `mask` covers both. Without padding
        neither mask nor positions is passed (the model counts positions from the cache)."""
        if not padded:
            return self.model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -x.shape[1]:]
        return self.model(input_ids=x, attention_mask=mask, position_ids=positions, past_key_values=cache,
                          use_cache=True, logits_to_keep=1)

    def score(self, req: dict) -> dict:
        torch = self.torch
        prompt, cont = req.get("prompt_token_ids"), req.get("continuation_ids")
        self._check_ids(prompt, "prompt_token_ids")
        self._check_ids(cont, "continuation_ids")
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        k = max(1, int(req.get("top_logprobs", 1)))
        if not cont:
            return {"id": req["id"], "steps": []}
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([prompt + cont])).logits[0].float()
        n = len(prompt)
        lps = torch.log_softmax(logits[n - 1 : n - 1 + len(cont)], dim=-1)
        v, i = torch.topk(lps, min(k, lps.shape[-1]), dim=-1)
        steps = []
        for j, tok in enumerate(cont):
            top = [[int(t), float(x)] for t, x in zip(i[j].tolist(), v[j].tolist())]
            steps.append({"token_id": tok, "logprob": float(lps[j, tok]), "top": top})
        return {"id": req["id"], "steps": steps}

    def dump(self, req: dict) -> dict:
        """The `dump` op (docs/engine-protocol.md, docs/localize.md): kda_dump.py, beside this file."""
        import kda_dump

        return kda_dump.dump(self, req)


class Requests:
    """Request lines straight from the descriptor: a buffered reader would hide the requests
    already waiting from select(), and every request would look like the only one in flight."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def _fill(self, timeout):
        if select.select([self.fd], [], [], timeout)[0]:
            data = os.read(self.fd, 1 << 16)
            self.buf += data
            self.eof = not data

    def group(self):
        """Block for one request, then take every request already waiting; None at EOF."""
        while b"\n" not in self.buf and not self.eof:
            self._fill(None)
        while not self.eof:
            size = len(self.buf)
            self._fill(0.01)
            if len(self.buf) == size:
                break
        if b"\n" not in self.buf:
            return None
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]  # a bad line: JSONDecodeError


def batches(group):
    """Generate requests that can share a batch (same max_tokens, top_logprobs, prefill_chunk)
    together; every other request on its own, in order."""
    keyed = {}
    for req in group:
        key = (req.get("max_tokens"), req.get("top_logprobs"), req.get("prefill_chunk")) \
            if req.get("op") == "generate" else ("solo", id(req))
        keyed.setdefault(key, []).append(req)
    return list(keyed.values())


def serve(engine, batch):
    """The replies to one batch; a failure is each request's error (the engine goes on)."""
    op = batch[0].get("op")
    try:
        if op == "generate":
            return engine.generate_group(batch)
        if op == "score":
            return [engine.score(batch[0])]
        if op == "dump":
            return [engine.dump(batch[0])]
        return [{"id": batch[0].get("id"), "error": f"unknown op {op!r}"}]
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        return [{"id": req.get("id"), "error": f"{type(e).__name__}: {e}"} for req in batch]


def main(argv=None) -> int:
    out = protocol_stdout()
    ap = argparse.ArgumentParser(description="Kimi-Linear example engine (strict-gate command protocol)")
    ap.add_argument("--model", default=os.environ.get("KDA_MODEL", str(DEFAULT_MODEL)))
    ap.add_argument("--dtype", default=os.environ.get("KDA_DTYPE", "bfloat16"),
                    choices=("bfloat16", "float32", "float16"))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KDA_THREADS", "0")) or None)
    ap.add_argument("--max-in-flight", type=int, default=8, help="requests the gate may keep outstanding")
    args = ap.parse_args(argv)

    device_kda = env_flag("DEVICE_KDA", "1")
    chunk_prefill = env_flag("KDA_CHUNK_PREFILL", "1")
    if chunk_prefill and not device_kda and "KDA_CHUNK_PREFILL" in os.environ:
        print("kda_engine: KDA_CHUNK_PREFILL=1 needs DEVICE_KDA=1 (chunk prefill is a device-path feature)",
              file=sys.stderr, flush=True)
        return 2
    prefill = "chunk" if device_kda and chunk_prefill else "recurrent"

    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"kda_engine: loading {args.model} ({args.dtype}); DEVICE_KDA={int(device_kda)} "
          f"KDA_CHUNK_PREFILL={int(chunk_prefill)} -> prefill {prefill}, decode recurrent", file=sys.stderr, flush=True)
    engine = KDAEngine(args.model, args.dtype, prefill)

    def send(obj):
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    send({
        "hello": PROTOCOL,
        "name": NAME,
        "version": VERSION,
        "model": str(args.model),
        "capabilities": ["generate", "score", "dump", "graft", "graft_ops", "dump_decode", "prefill_chunk"],
        "dtype": args.dtype,
        "max_in_flight": args.max_in_flight,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {"DEVICE_KDA": int(device_kda), "KDA_CHUNK_PREFILL": int(chunk_prefill),
                     "prefill": prefill, "decode": "recurrent", "dtype": args.dtype,
                     "threads": torch.get_num_threads()},
    })
    lines = Requests(sys.stdin.fileno())
    while True:
        try:
            group = lines.group()
        except json.JSONDecodeError as e:
            print(f"kda_engine: bad request line: {e}", file=sys.stderr, flush=True)
            return 2
        if group is None or any(req.get("op") == "shutdown" for req in group):
            break
        for batch in batches(group):
            for reply in serve(engine, batch):
                send(reply)
    print(f"kda_engine: shutting down; KDA multi-token passes and batches: {engine.calls}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
