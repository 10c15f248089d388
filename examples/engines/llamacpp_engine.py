#!/usr/bin/env python
"""llama.cpp as a strict-gate candidate: a GGUF model served over the command protocol
(strict-gate/engine@1, docs/engine-protocol.md), through llama-cpp-python's C API.

It runs under the llama.cpp venv made by scripts/install-llamacpp.sh (`command =
["../.venvs/llamacpp/bin/python", "../examples/engines/llamacpp_engine.py", "--model", ...]`),
not under the gate's interpreter. It drives llama.cpp itself (llama_decode on a batch it
fills) instead of the high-level `Llama` class: the gate wants the FULL logits of every step,
not llama.cpp's sampler, and each setting below has to be under our control.

- generate: greedy. The prompt ids go in as sent (no BOS added), one llama_decode over the
  prompt, then one per generated token against the KV cache. The token is the argmax of the
  raw float32 logits (llama_get_logits_ith); logprobs and the top k are log_softmax of the
  same full logits in float32 (not llama.cpp's sampler top-k, which sees a truncated,
  possibly temperature-scaled list); on an exact tie np.argmax takes the lowest id, as vLLM.
  Generation stops on the request's eos_token_ids (the set vLLM stops on: the tokenizer's and
  generation_config's eos ids, sent by the gate), else on the GGUF vocabulary's
  end-of-generation ids (llama_vocab_is_eog: eos and any eot/eom ids); the EOS is included in
  token_ids with finish_reason "stop". For the bundled tiny-llama both sets are {2}.
- score: teacher forcing, one llama_decode over prompt + continuation with logits kept at
  positions len(prompt)-1 ... (each continuation token given everything before it).
- dump: the graph callback in a second context; `"mode": "decode"` decodes the first
  decode_from ids as one batch, then each later id as a one-token batch (the decode path).

Traps this adapter handles, each measured on the bundled tiny-llama (benchmarks/README.md):
- KV cache type. llama.cpp stores K and V in f16 by default, so an F32 GGUF is NOT computed in
  float32 end to end (tiny-llama: 127/128, one near-tie, against vLLM's fp32 tokens). The default here is an f32 KV
  cache (type_k = type_v = GGML_TYPE_F32); `--kv-type f16` gives llama.cpp's default back.
  The hello's settings say which one ran.
- Flash attention. llama.cpp's default (auto, on for the CPU) casts K and V to f16 before
  its flash-attention kernel (llama-graph.cpp, build_attn_mha), so an f32 KV cache is f16
  again inside attention (tiny-llama: 126/128). The default here is `--flash-attn off`; the
  hello says which ran.
- Context size. llama.cpp rounds n_ctx up to a multiple of 256, while llama-cpp-python's
  `Llama` sizes its arrays to the value asked for; `--n-ctx` must be a multiple of 256 and the
  prompt limit is what llama_n_ctx reports. n_batch = n_ubatch = n_ctx, so a prompt is never
  split across micro-batches.
- Extra buffer types. On load llama.cpp repacks quantized weights into CPU-specific layouts
  (its AMX and repack "extra buffer types"), a path where Q8_0 has been seen to die of SIGILL
  (not on the development machine's AVX2 build, where it changed no token). The default here
  loads with use_extra_bufts = False (plain CPU buffers); `--extra-bufts` turns them back on. Should the engine ever die of a signal, the
  gate reports it (exit 3, "was killed by SIGILL") and keeps the prompts finished so far;
  faulthandler writes the Python stack to the engine log first.

stdout carries only protocol lines (the real stdout is kept on a private descriptor, fd 1 goes
to stderr, where llama.cpp's own log goes too). When stdin closes (also inside a line) or
stdout breaks (the gate died), the engine exits 0 quietly.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import logging
import os
import sys
import time
import traceback

import numpy as np

PROTOCOL = "strict-gate/engine@1"
NAME = "llama.cpp"
KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # LLAMA_FLASH_ATTN_TYPE_*


def protocol_stdout():
    """Keep the real stdout for protocol lines; anything else printed goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax in float32, as the protocol asks (`log_softmax(logits.float())`)."""
    z = logits.astype(np.float32) - logits.max()
    return z - np.log(np.exp(z).sum(dtype=np.float32))


def top_pairs(lp: np.ndarray, k: int, chosen: int | None) -> list[list]:
    """The k best [id, logprob] pairs of the full distribution, plus `chosen` if it is not among them."""
    k = min(k, lp.shape[0])
    idx = np.argpartition(-lp, k - 1)[:k] if k > 0 else np.array([], dtype=np.int64)
    idx = idx[np.argsort(-lp[idx], kind="stable")]
    pairs = [[int(t), float(lp[t])] for t in idx]
    if chosen is not None and chosen not in {t for t, _ in pairs}:
        pairs.append([chosen, float(lp[chosen])])
    return pairs


class LlamaCppEngine:
    """One llama.cpp model and context, batch 1, the KV cache cleared before every request."""

    def __init__(self, model: str, n_ctx: int, kv_type: str, flash_attn: str, threads: int, extra_bufts: bool):
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = extra_bufts
        self.model = L.llama_model_load_from_file(model.encode(), mp)
        if not self.model:
            raise SystemExit(f"llamacpp_engine: llama.cpp could not load {model} (see the log above); "
                             "make the GGUF files with: bash scripts/install-llamacpp.sh")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.ctx_args = (n_ctx, threads, kv_type, flash_attn)
        self.dump_ctx = None  # made on the first dump request, with the graph callback
        self.ctx = L.llama_init_from_model(self.model, self._context_params())
        if not self.ctx:
            raise SystemExit(f"llamacpp_engine: llama.cpp could not make a context (n_ctx {n_ctx}, KV {kv_type}); "
                             "see the log above")
        self.n_ctx = L.llama_n_ctx(self.ctx)
        if self.n_ctx != n_ctx:
            raise SystemExit(f"llamacpp_engine: asked for n_ctx {n_ctx}, llama.cpp made {self.n_ctx}; "
                             "pass a multiple of 256")
        self.batch = L.llama_batch_init(self.n_ctx, 0, 1)
        self.eog = [t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.vocab, t)]
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, len(desc))
        self.desc = desc.value.decode("utf-8", "replace")
        self.settings = {
            "model_file": model, "model_desc": self.desc, "n_vocab": self.n_vocab, "eog_ids": self.eog,
            "kv_type": kv_type, "flash_attn": flash_attn, "n_ctx": self.n_ctx, "threads": threads,
            "extra_bufts": extra_bufts, "logits": "full vocabulary, float32 log_softmax",
        }

    def _context_params(self):
        n_ctx, threads, kv_type, flash_attn = self.ctx_args
        cp = self.L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = KV_TYPES[kv_type]
        cp.flash_attn_type = FLASH_ATTN[flash_attn]
        cp.no_perf = True
        return cp

    def _check_ids(self, ids, what: str) -> None:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{what} must be a list of integers")
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"{what} holds ids outside the vocabulary (size {self.n_vocab}): {bad[:5]}")

    def _fits(self, n: int) -> None:
        if n > self.n_ctx:
            raise ValueError(f"{n} positions do not fit the context ({self.n_ctx}); raise --n-ctx (a multiple of 256)")

    def _decode(self, ids: list[int], start: int, outputs: range) -> None:
        """One llama_decode of `ids` at positions start..., keeping logits at batch indices `outputs`."""
        b = self.batch
        b.n_tokens = len(ids)
        for i, t in enumerate(ids):
            b.token[i] = t
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i in outputs
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} ({len(ids)} tokens at position {start})")

    def _logits(self, i: int) -> np.ndarray:
        p = self.L.llama_get_logits_ith(self.ctx, i)
        if not p:
            raise RuntimeError(f"llama.cpp kept no logits at batch index {i}")
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,)).astype(np.float32)

    def _eos(self, req: dict) -> set[int]:
        """The request's eos_token_ids (vLLM's set, sent by the gate), else the GGUF's eog ids."""
        ids = req.get("eos_token_ids")
        if ids is None:
            return set(self.eog)
        self._check_ids(ids, "eos_token_ids")
        return set(ids)

    def _reset(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def dump(self, req: dict) -> dict:
        """The `dump` op (docs/engine-protocol.md, docs/localize.md): one llama_decode of the ids in a
        second context made with the graph callback (the serving context stays as it was), logits
        kept at every position so the last layer keeps every row; the tensors of the positions
        asked for go to one safetensors file inside req["directory"]."""
        from safetensors.numpy import save_file

        ids, positions = req.get("prompt_token_ids"), req.get("positions")
        self._check_ids(ids, "prompt_token_ids")
        self._fits(len(ids))
        if not isinstance(positions, list) or not all(isinstance(p, int) and 0 <= p < len(ids) for p in positions):
            raise ValueError("positions must be a list of indices into prompt_token_ids")
        if req.get("graft"):
            raise ValueError("this engine cannot graft (no \"graft\" capability)")
        n0 = req.get("decode_from") if req.get("mode") == "decode" else len(ids)
        if not isinstance(n0, int) or not 1 <= n0 <= len(ids):
            raise ValueError("a decode dump needs decode_from in 1..len(prompt_token_ids)")
        if self.dump_ctx is None:
            self.tap = GraphTap(self.L)
            cp = self._context_params()
            cp.cb_eval = self.tap.callback
            self.dump_ctx = self.L.llama_init_from_model(self.model, cp)
            if not self.dump_ctx:
                raise RuntimeError("llama.cpp could not make the dump context")
        self.tap.wanted = set(req["points"]) if req.get("points") else None
        self.tap.rows = {}
        self.L.llama_memory_clear(self.L.llama_get_memory(self.dump_ctx), True)
        main, self.ctx = self.ctx, self.dump_ctx
        try:
            self._decode(ids[:n0], 0, range(n0))  # the prompt pass; in decode mode, then one id per batch:
            for t in range(n0, len(ids)):  # llama.cpp's decode path, the KV cache the earlier passes left
                self._decode([ids[t]], t, range(1))
        finally:
            self.ctx = main
        joined = {name: np.concatenate(parts) for name, parts in self.tap.rows.items()}
        kept = {name: np.ascontiguousarray(rows[positions]) for name, rows in joined.items()
                if rows.shape[0] == len(ids)}
        path = os.path.join(req["directory"], "activations.safetensors")
        save_file(kept, path)
        return {"id": req["id"], "path": path, "points": sorted(kept)}

    def generate(self, req: dict) -> dict:
        ids = req.get("prompt_token_ids")
        self._check_ids(ids, "prompt_token_ids")
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        max_tokens, k = int(req.get("max_tokens", 16)), int(req.get("top_logprobs", 0))
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self._fits(len(ids) + max_tokens - 1)
        eog = set() if req.get("ignore_eos") else self._eos(req)  # the speed arm times max_tokens tokens
        t0 = time.perf_counter()
        ttft = None
        self._reset()
        self._decode(ids, 0, range(len(ids) - 1, len(ids)))
        logits = self._logits(len(ids) - 1)
        toks, tops = [], []
        while True:
            tok = int(np.argmax(logits))
            toks.append(tok)
            tops.append(top_pairs(log_softmax(logits), k, tok))
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            if tok in eog or len(toks) == max_tokens:
                break
            self._decode([tok], len(ids) + len(toks) - 1, range(1))
            logits = self._logits(0)
        return {
            "id": req["id"], "prompt_token_ids": ids, "token_ids": toks,
            "finish_reason": "stop" if toks[-1] in eog else "length",
            "top_logprobs": tops,
            "timing": {"ttft_s": ttft, "total_s": time.perf_counter() - t0},
        }

    def score(self, req: dict) -> dict:
        prompt, cont = req.get("prompt_token_ids"), req.get("continuation_ids")
        self._check_ids(prompt, "prompt_token_ids")
        self._check_ids(cont, "continuation_ids")
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        if not cont:
            return {"id": req["id"], "steps": []}
        k = max(1, int(req.get("top_logprobs", 1)))
        seq = prompt + cont
        self._fits(len(seq))
        n = len(prompt)
        self._reset()
        self._decode(seq, 0, range(n - 1, len(seq) - 1))
        steps = []
        for j, tok in enumerate(cont):
            lp = log_softmax(self._logits(n - 1 + j))
            steps.append({"token_id": tok, "logprob": float(lp[tok]), "top": top_pairs(lp, k, None)})
        return {"id": req["id"], "steps": steps}


# llama.cpp's graph names (cb(cur, "name", il) -> "name-il") -> strict-gate's canonical points.
# kqv_out-N is attention BEFORE its output projection (wo), so it is not `layers.N.attn`
# (transformers' self_attn output includes o_proj): attn_out-N is, and only it is mapped.
GRAPH_POINTS = {"inp_embd": "embed", "result_norm": "norm", "result_output": "logits"}
LAYER_POINTS = {"attn_out": "attn", "ffn_out": "mlp", "l_out": None}


def canonical_point(name: str) -> str | None:
    if name in GRAPH_POINTS:
        return GRAPH_POINTS[name]
    base, _, il = name.rpartition("-")
    if base in LAYER_POINTS and il.isdigit():
        sub = LAYER_POINTS[base]
        return f"layers.{il}" + (f".{sub}" if sub else "")
    return None


class GraphTap:
    """llama.cpp's graph evaluation callback (cb_eval): asks for the tensors that map to the
    points wanted and copies each, once computed, as float32 rows (one per token). The tensor's
    type and ne[] are read from struct ggml_tensor (type at offset 0, ne[4] int64 at offset 16,
    ggml.h's layout), the name and data through libggml-base's own functions."""

    def __init__(self, L):
        import llama_cpp._ggml as G

        self.lib = G.libggml
        self.lib.ggml_get_name.restype = ctypes.c_char_p
        self.lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        self.lib.ggml_nelements.restype = ctypes.c_int64
        self.lib.ggml_nelements.argtypes = [ctypes.c_void_p]
        self.lib.ggml_is_contiguous.restype = ctypes.c_bool
        self.lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        self.lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self.wanted: set[str] | None = None
        self.rows: dict[str, list[np.ndarray]] = {}  # per point, each decode call's rows in order
        self.callback = L.ggml_backend_sched_eval_callback(self._eval)  # kept alive with the context

    def _eval(self, t, ask, _user) -> bool:
        point = canonical_point(self.lib.ggml_get_name(t).decode("utf-8", "replace"))
        if point is None or (self.wanted is not None and point not in self.wanted):
            return not ask  # not asked for; and never stop a computation
        if ask:
            return True
        gtype = ctypes.cast(t, ctypes.POINTER(ctypes.c_int32))[0]
        ne0 = ctypes.cast(t, ctypes.POINTER(ctypes.c_int64))[2]
        n = self.lib.ggml_nelements(t)
        if gtype != 0 or not self.lib.ggml_is_contiguous(t):  # GGML_TYPE_F32, contiguous only
            return True
        buf = np.empty(n, dtype=np.float32)
        self.lib.ggml_backend_tensor_get(t, buf.ctypes.data, 0, n * 4)
        self.rows.setdefault(point, []).append(buf.reshape(-1, ne0))
        return True


def n_ctx_arg(v: str) -> int:
    n = int(v)
    if n <= 0 or n % 256:
        raise argparse.ArgumentTypeError(f"{n}: llama.cpp rounds n_ctx up to a multiple of 256; give one")
    return n


def serve(engine: LlamaCppEngine, out) -> int:
    """The request loop: one response line per request; EOF or shutdown ends it."""

    def send(obj: dict) -> None:
        try:
            out.write(json.dumps(obj, separators=(",", ":")) + "\n")
            out.flush()
        except BrokenPipeError:  # the gate is gone: nobody to answer, nothing to report
            os._exit(0)

    import llama_cpp

    send({
        "hello": PROTOCOL, "name": NAME, "version": llama_cpp.__version__, "model": engine.desc,
        "capabilities": ["generate", "score", "dump", "dump_decode"],
        "versions": {"llama-cpp-python": llama_cpp.__version__, "numpy": np.__version__,
                     "system_info": llama_cpp.llama_print_system_info().decode().strip()},
        "settings": engine.settings,
        # facts the speed arm's matched-config check compares (docs/engine-protocol.md)
        "kv_cache": f"{engine.settings['kv_type']}, {engine.n_ctx} tokens", "prefix_cache": False,
        "max_context": engine.n_ctx,
    })
    for line in sys.stdin:
        if not line.endswith("\n"):  # EOF inside a line: the gate died while writing it
            break
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            print(f"llamacpp_engine: bad request line: {e}", file=sys.stderr, flush=True)
            return 2
        op, rid = req.get("op"), req.get("id")
        if op == "shutdown":
            break
        try:
            if op == "generate":
                send(engine.generate(req))
            elif op == "score":
                send(engine.score(req))
            elif op == "dump":
                send(engine.dump(req))
            else:
                send({"id": rid, "error": f"unknown op {op!r}"})
        except (ValueError, RuntimeError) as e:  # this request fails; the engine goes on
            traceback.print_exc(file=sys.stderr)
            send({"id": rid, "error": f"{type(e).__name__}: {e}"})
    return 0


def main(argv: list[str] | None = None) -> int:
    out = protocol_stdout()
    faulthandler.enable(file=sys.stderr)  # a SIGILL/SIGSEGV in llama.cpp leaves a stack in the log
    ap = argparse.ArgumentParser(description="llama.cpp engine for strict-gate (command protocol)")
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--n-ctx", type=n_ctx_arg, default=512, help="context size, a multiple of 256 (default 512)")
    ap.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f32",
                    help="KV cache type (default f32; llama.cpp's own default, f16, breaks an F32 model's strictness)")
    ap.add_argument("--flash-attn", choices=sorted(FLASH_ATTN), default="off",
                    help="llama.cpp's flash attention (default off: it casts an f32 KV cache to f16; llama.cpp's default is auto)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--extra-bufts", action="store_true",
                    help="let llama.cpp repack weights into CPU-specific buffers (AMX/repack; SIGILL seen on Q8_0)")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.model):
        print(f"llamacpp_engine: {args.model}: no such GGUF file; make it with: bash scripts/install-llamacpp.sh",
              file=sys.stderr, flush=True)
        return 2
    logging.getLogger("llama-cpp-python").setLevel(logging.INFO)  # llama.cpp's log (to stderr), no debug
    engine = LlamaCppEngine(args.model, args.n_ctx, args.kv_type, args.flash_attn, args.threads, args.extra_bufts)
    return serve(engine, out)


if __name__ == "__main__":
    sys.exit(main())
