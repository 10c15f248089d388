#!/usr/bin/env python
"""An OpenVINO GenAI engine for strict-gate, over the command protocol (strict-gate/engine@1:
JSON lines on stdin/stdout, docs/engine-protocol.md).

It runs under OpenVINO's own interpreter (.venvs/openvino, made by
scripts/install-openvino.sh), never strict-gate's: a gate names that interpreter in its
`command`. It loads an IR converted by scripts/convert_openvino.py and answers:

  generate  the tokens from OpenVINO GenAI's own greedy loop (`LLMPipeline.generate` on the
            prompt ids, do_sample off). GenAI returns no per-step logits or top-k, so the
            same IR is stepped through plain OpenVINO (a stateful InferRequest: the prompt,
            then each generated token against the KV cache, as GenAI decodes): the top-k and
            the chosen token's logprob are log_softmax of those full-vocabulary logits in
            float32. A GenAI token that is not the argmax of the stepped logits is written to
            stderr (the gate's audit marks the prompt `not_greedy`).
  score     teacher forcing, one plain OpenVINO pass over prompt + continuation: the logits
            of every position; step i is read at position len(prompt) - 1 + i.

Traps of OpenVINO 2026.4 that this adapter handles:

  * The CPU plugin's defaults are NOT float32: on a CPU with bf16 (AMX/AVX512-BF16) it
    computes in bf16 (INFERENCE_PRECISION_HINT), and it keeps the KV cache narrower than f32
    (KV_CACHE_PRECISION: u8 on the AVX512-BF16 dev box, f16 elsewhere). Both are pinned to f32 here, for GenAI and for the
    stepping model alike, and read back from the compiled model: another value is refused
    (exit 2). `--precision native` gives the plugin's defaults back (the hello says which).
  * Dynamic quantisation: with int8 weights the CPU plugin also quantises the ACTIVATIONS to int8
    on the fly, in groups of 32 (DYNAMIC_QUANTIZATION_GROUP_SIZE), so an "int8 weights, f32
    compute" model is not that, and its prefill and decode differ (check-engine's
    prefill_decode: 0.37 nats on SmolLM2). Pinned to 0 (off) with the two above, read back.
  * GenAI's LLMPipeline picks its backend itself (continuous batching with paged attention
    or the stateful SDPA model); ATTENTION_BACKEND=SDPA is pinned, the path the stepping
    request runs, so the two decode the same graph.
  * ignore_eos (the speed arm) is GenAI's own ignore_eos.
  * EOS: GenAI stops on generation_config.json's eos_token_id unless told otherwise. The
    adapter sets stop_token_ids to the request's eos_token_ids (the set vLLM stops on), else
    to its model's own set; the EOS is kept in token_ids (finish_reason "stop").

stdout carries only protocol lines (fd 1 is pointed at stderr). When stdin closes or stdout
breaks (the gate died), the engine exits quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PROTOCOL = "strict-gate/engine@1"
NAME = "openvino-genai-example"
VERSION = "0.1.0"
F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


def protocol_stdout():
    """Keep the real stdout for protocol lines; anything else printed goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def log(msg: str) -> None:
    print(f"openvino_engine: {msg}", file=sys.stderr, flush=True)


def eos_ids(model_dir: Path, vocab: int) -> set[int]:
    """The ids vLLM stops on by default: config.json's and generation_config.json's eos_token_id."""
    ids: set[int] = set()
    for f in ("config.json", "generation_config.json"):
        if (model_dir / f).is_file():
            e = json.loads((model_dir / f).read_text()).get("eos_token_id")
            ids.update(e if isinstance(e, list) else [] if e is None else [e])
    if not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
        raise SystemExit(f"{model_dir}: EOS ids {sorted(ids)} missing or outside the vocabulary ({vocab}); "
                         "re-convert with scripts/convert_openvino.py")
    return ids


def dtype(model_dir: Path, compute: str) -> str:
    """The hello's `dtype` fact: the weights' format for int8 weights, else the compute type."""
    stamp = model_dir / "strict-gate-conversion.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("weights") == "int8":
        return "int8"
    return {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}.get(compute, compute)


class OVEngine:
    def __init__(self, model_dir: Path, precision: str, threads: int):
        import numpy as np
        import openvino as ov
        import openvino_genai

        self.np, self.ov, self.genai = np, ov, openvino_genai
        props = {"INFERENCE_NUM_THREADS": threads, **(F32 if precision == "f32" else {})}
        core = ov.Core()
        self.compiled = core.compile_model(model_dir / "openvino_model.xml", "CPU", props)
        self.settings = {k: self._prop(k) for k in (*F32, "INFERENCE_NUM_THREADS")}
        got = {k: self.settings[k] for k in F32}
        if precision == "f32" and got != F32:
            raise SystemExit(f"asked OpenVINO for {F32}, the CPU plugin compiled {got}: refusing")
        self.request = self.compiled.create_infer_request()
        self.pipe = openvino_genai.LLMPipeline(str(model_dir), "CPU", ATTENTION_BACKEND="SDPA", **props)
        self.vocab = int(self.compiled.output("logits").get_partial_shape()[-1].get_length())
        self.eos = eos_ids(model_dir, self.vocab)

    def _prop(self, key: str) -> str:
        v = self.compiled.get_property(key)
        return v.to_string() if hasattr(v, "to_string") else str(v)  # an ov.Type: "f32", "bf16", "f16"

    def _check_ids(self, ids, what: str) -> list[int]:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{what} must be a list of integers")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"{what} holds ids outside the vocabulary (size {self.vocab}): {bad[:5]}")
        return ids

    def _log_softmax(self, logits):
        x = self.np.asarray(logits, dtype=self.np.float32)
        m = x.max(axis=-1, keepdims=True)
        return x - m - self.np.log(self.np.exp(x - m).sum(axis=-1, keepdims=True, dtype=self.np.float32))

    def _top(self, lp, k: int) -> list[list]:
        idx = self.np.argsort(-lp, kind="stable")[:k]
        return [[int(t), float(lp[t])] for t in idx]

    def _forward(self, ids: list[int], start: int):
        """One pass of the stateful model over ids at positions start...: logits [len(ids), vocab]."""
        np = self.np
        n = len(ids)
        out = self.request.infer({
            "input_ids": np.array([ids], dtype=np.int64),
            "attention_mask": np.ones((1, start + n), dtype=np.int64),
            "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, dtype=np.int32),
        })
        return np.array(out["logits"][0], dtype=np.float32)

    def _genai(self, ids: list[int], max_tokens: int, eos: set[int], ignore: bool) -> tuple[list[int], float]:
        cfg = self.genai.GenerationConfig()
        cfg.max_new_tokens, cfg.do_sample, cfg.num_beams = max_tokens, False, 1
        cfg.stop_token_ids, cfg.eos_token_id, cfg.ignore_eos = set(eos), min(eos), ignore
        t0 = time.perf_counter()
        res = self.pipe.generate(self.ov.Tensor(self.np.array([ids], dtype=self.np.int64)), cfg)
        return [int(t) for t in res.tokens[0]], time.perf_counter() - t0

    def generate(self, req: dict) -> dict:
        ids = self._check_ids(req.get("prompt_token_ids"), "prompt_token_ids")
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        max_tokens, k = int(req.get("max_tokens", 16)), int(req.get("top_logprobs", 0))
        eos = set(self._check_ids(req["eos_token_ids"], "eos_token_ids")) if req.get("eos_token_ids") else self.eos
        ignore = bool(req.get("ignore_eos"))
        toks, total = self._genai(ids, max_tokens, eos, ignore)
        if not toks:
            raise RuntimeError("OpenVINO GenAI returned no token")
        self.request.reset_state()
        logits, tops = self._forward(ids, 0)[-1], []
        for i, tok in enumerate(toks):
            lp = self._log_softmax(logits)
            if lp[tok] < lp.max():
                log(f"{req['id']} step {i}: GenAI chose {tok} ({lp[tok]:.6g}), stepped argmax "
                    f"{int(lp.argmax())} ({lp.max():.6g})")
            top = self._top(lp, k)
            tops.append(top if tok in {t for t, _ in top} else top + [[tok, float(lp[tok])]])
            if i + 1 < len(toks):
                logits = self._forward([tok], len(ids) + i)[-1]
        return {
            "id": req["id"], "prompt_token_ids": ids, "token_ids": toks,
            "finish_reason": "stop" if toks[-1] in eos and not ignore else "length", "top_logprobs": tops,
            "timing": {"total_s": total},
        }

    def score(self, req: dict) -> dict:
        prompt = self._check_ids(req.get("prompt_token_ids"), "prompt_token_ids")
        cont = self._check_ids(req.get("continuation_ids"), "continuation_ids")
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        if not cont:
            return {"id": req["id"], "steps": []}
        k = max(1, int(req.get("top_logprobs", 1)))
        self.request.reset_state()
        n = len(prompt)
        lps = self._log_softmax(self._forward(prompt + cont, 0)[n - 1 : n - 1 + len(cont)])
        return {"id": req["id"], "steps": [
            {"token_id": tok, "logprob": float(lps[j, tok]), "top": self._top(lps[j], k)} for j, tok in enumerate(cont)
        ]}


def serve(engine: OVEngine, out, hello: dict) -> int:
    def send(obj: dict) -> None:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    send(hello)
    for line in sys.stdin:
        if not line.endswith("\n"):  # EOF inside a line: the gate died while writing it
            break
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            log(f"bad request line: {e}")
            return 2
        op, rid = req.get("op"), req.get("id")
        if op == "shutdown":
            break
        try:
            resp = engine.generate(req) if op == "generate" else engine.score(req) if op == "score" else None
        except Exception as e:  # this request fails; the engine goes on
            log(f"{rid}: {type(e).__name__}: {e}")
            resp = {"id": rid, "error": f"{type(e).__name__}: {e}"}
        send(resp or {"id": rid, "error": f"unknown op {op!r}"})
    return 0


def main(argv: list[str] | None = None) -> int:
    out = protocol_stdout()
    ap = argparse.ArgumentParser(description="OpenVINO GenAI engine (strict-gate command protocol)")
    ap.add_argument("--model", type=Path, required=True, help="an IR converted by scripts/convert_openvino.py")
    ap.add_argument("--precision", default="f32", choices=("f32", "native"),
                    help="f32: pin f32 compute and KV cache (default); native: the CPU plugin's own defaults")
    ap.add_argument("--threads", type=int, default=1, help="INFERENCE_NUM_THREADS (0: OpenVINO's choice)")
    args = ap.parse_args(argv)
    if not (args.model / "openvino_model.xml").is_file():
        log(f"{args.model}: no converted model; run: bash scripts/install-openvino.sh")
        return 2
    import openvino
    import openvino_genai

    try:
        engine = OVEngine(args.model, args.precision, args.threads)
    except SystemExit as e:
        log(str(e))
        return 2
    log(f"loaded {args.model}: {engine.settings}, EOS {sorted(engine.eos)}")
    hello = {
        "hello": PROTOCOL, "name": NAME, "version": VERSION, "model": str(args.model),
        "capabilities": ["generate", "score"],
        "versions": {"openvino": openvino.__version__, "openvino_genai": openvino_genai.__version__},
        "settings": {"precision": args.precision, **engine.settings, "eos": sorted(engine.eos)},
        "dtype": dtype(args.model, engine.settings["INFERENCE_PRECISION_HINT"]), "eager": False, "prefix_cache": False,
    }
    try:
        return serve(engine, out, hello)
    except BrokenPipeError:  # the gate is gone: nobody to answer
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
