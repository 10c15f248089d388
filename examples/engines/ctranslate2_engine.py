#!/usr/bin/env python
"""A CTranslate2 engine for strict-gate, over the command protocol (strict-gate/engine@1:
JSON lines on stdin/stdout, docs/engine-protocol.md).

It runs under CTranslate2's own interpreter (.venvs/ctranslate2, made by
scripts/install-ctranslate2.sh), never strict-gate's: a gate names that interpreter in its
`command`. It loads a model converted by scripts/convert_ctranslate2.py and answers:

  generate  `Generator.generate_batch`, greedy (beam 1, sampling_topk 1), with
            `return_logits_vocab=True`: the FULL-vocabulary logits of every step, the very
            logits the greedy step chose from. Top-k and the chosen token's logprob are
            log_softmax of those logits in float32, so the decode and what is reported cannot
            disagree (a step whose token is not the argmax of its own logits is written to
            stderr, and the gate's audit marks the prompt `not_greedy`).
  score     `Generator.forward_batch` over prompt + continuation: the logits of every
            position in one pass; step i is read at position len(prompt) - 1 + i.

Traps of CTranslate2 4.8 that this adapter handles:

  * `generate_batch` takes token STRINGS, not ids: ids are mapped through the model's
    vocabulary.json (the id -> token table the converter wrote), and every id is checked
    to be inside it.
  * `return_logits_vocab` returns RAW logits, although its docstring says log probabilities:
    log_softmax is applied here, in float32.
  * EOS: CTranslate2 stops only on the tokenizer's EOS string by default, and drops it from
    the result. The adapter stops on the request's `eos_token_ids` (the set vLLM stops on, sent
    by the gate), else on its own model files' set (config.json's eos_token plus
    generation_config.json's eos_token_id(s), which the converter copies), passed as
    `end_token` with `return_end_token=True`: the EOS ends `token_ids`, finish_reason "stop".
  * Exact ties at the argmax: CTranslate2's greedy step picks among exactly equal logits its
    own way, not necessarily the lowest id as vLLM does; the gate's greedy check accepts it
    and a flip there shows as a near-tie with gap 0. The reported top-k lists ties by id.
  * Compute types: CTranslate2 silently swaps a compute type the CPU cannot run for another
    (an int16 model loads as int8_float32). The requested --compute-type is checked against
    what CTranslate2 selected and refused, exit 2, when it differs: bfloat16 needs a CPU or GPU
    with bfloat16 support (this project's x86 CPUs have none); int16 on CPU needs Intel MKL's
    int16 GEMM, which CTranslate2 enables by default only on Intel CPUs (CT2_USE_MKL=1 turns it
    on elsewhere).

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
NAME = "ctranslate2-example"
VERSION = "0.1.0"
COMPUTE_TYPES = ("float32", "int8", "int8_float32", "int16", "bfloat16", "float16", "int8_bfloat16")
SAME = {"int8": "int8_float32"}  # on CPU, CTranslate2 runs an int8 request as int8_float32


def protocol_stdout():
    """Keep the real stdout for protocol lines; anything else printed goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def log(msg: str) -> None:
    print(f"ctranslate2_engine: {msg}", file=sys.stderr, flush=True)


def eos_ids(model_dir: Path, vocab: list[str]) -> set[int]:
    """The ids vLLM stops on: the tokenizer's EOS (config.json) plus generation_config's."""
    ids: set[int] = set()
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("eos_token") in vocab:
        ids.add(vocab.index(cfg["eos_token"]))
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(e if isinstance(e, list) else [] if e is None else [e])
    if not all(isinstance(i, int) and 0 <= i < len(vocab) for i in ids):
        raise SystemExit(f"{model_dir}: EOS ids {sorted(ids)} outside the vocabulary ({len(vocab)} tokens)")
    if not ids:
        raise SystemExit(f"{model_dir}: no EOS token (config.json eos_token, generation_config.json eos_token_id); "
                         "re-convert with scripts/convert_ctranslate2.py")
    return ids


class CT2Engine:
    def __init__(self, model_dir: Path, compute_type: str, threads: int):
        import ctranslate2
        import numpy as np

        self.np = np
        supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
        if compute_type not in supported:
            raise SystemExit(self._refusal(compute_type, supported))
        self.generator = ctranslate2.Generator(str(model_dir), device="cpu", compute_type=compute_type,
                                               intra_threads=threads)
        self.compute_type = self.generator.compute_type
        if SAME.get(compute_type, compute_type) != self.compute_type:
            raise SystemExit(f"asked for compute type {compute_type}, CTranslate2 selected {self.compute_type}: "
                             "refusing to run another precision than the gate names")
        self.vocab: list[str] = json.loads((model_dir / "vocabulary.json").read_text())
        self.eos = eos_ids(model_dir, self.vocab)

    @staticmethod
    def _refusal(compute_type: str, supported: list[str]) -> str:
        why = {"bfloat16": "bfloat16 needs a CPU with bfloat16 instructions (AVX512-BF16/AMX) or a GPU",
               "int16": "int16 on CPU needs Intel MKL's int16 GEMM: set CT2_USE_MKL=1 in the arm's env "
                        "(CTranslate2 turns MKL on by default only on Intel CPUs)"}.get(compute_type, "")
        return (f"CTranslate2 refuses compute type {compute_type} on this CPU (it supports {', '.join(supported)})"
                f"{': ' + why if why else ''}; pick one of those with --compute-type")

    def _check_ids(self, ids, what: str) -> list[int]:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{what} must be a list of integers")
        bad = [t for t in ids if not 0 <= t < len(self.vocab)]
        if bad:
            raise ValueError(f"{what} holds ids outside the vocabulary (size {len(self.vocab)}): {bad[:5]}")
        return ids

    def _log_softmax(self, logits):
        x = self.np.asarray(logits, dtype=self.np.float32)
        m = x.max(axis=-1, keepdims=True)
        return x - m - self.np.log(self.np.exp(x - m).sum(axis=-1, keepdims=True, dtype=self.np.float32))

    def _top(self, lp, k: int) -> list[list]:
        idx = self.np.argsort(-lp, kind="stable")[:k]
        return [[int(t), float(lp[t])] for t in idx]

    def generate(self, req: dict) -> dict:
        ids = self._check_ids(req.get("prompt_token_ids"), "prompt_token_ids")
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        max_tokens, k = int(req.get("max_tokens", 16)), int(req.get("top_logprobs", 0))
        eos = set(self._check_ids(req["eos_token_ids"], "eos_token_ids")) if req.get("eos_token_ids") else self.eos
        first: list[float] = []

        def on_step(step) -> bool:  # times the first token; False: go on decoding
            if not first:
                first.append(time.perf_counter())
            return False

        t0 = time.perf_counter()
        (res,) = self.generator.generate_batch(
            [[self.vocab[t] for t in ids]], max_length=max_tokens, beam_size=1, sampling_topk=1,
            include_prompt_in_result=False, end_token=sorted(eos), return_end_token=True,
            return_logits_vocab=True, callback=on_step,
        )
        total = time.perf_counter() - t0
        toks = [int(t) for t in res.sequences_ids[0]]
        steps = res.logits[0]
        if not toks or len(steps) != len(toks):
            raise RuntimeError(f"CTranslate2 returned {len(toks)} tokens and {len(steps)} logit rows")
        tops = []
        for i, (tok, logits) in enumerate(zip(toks, steps)):
            lp = self._log_softmax(logits)
            if lp.shape[-1] != len(self.vocab):
                raise RuntimeError(f"logits of width {lp.shape[-1]}, vocabulary of {len(self.vocab)}")
            if lp[tok] < lp.max():
                log(f"{req['id']} step {i}: chose {tok} ({lp[tok]:.6g}), argmax {int(lp.argmax())} ({lp.max():.6g})")
            top = self._top(lp, k)
            tops.append(top if tok in {t for t, _ in top} else top + [[tok, float(lp[tok])]])
        return {
            "id": req["id"], "prompt_token_ids": ids, "token_ids": toks,
            "finish_reason": "stop" if toks[-1] in eos else "length", "top_logprobs": tops,
            "timing": {"total_s": total, **({"ttft_s": first[0] - t0} if first else {})},
        }

    def score(self, req: dict) -> dict:
        prompt = self._check_ids(req.get("prompt_token_ids"), "prompt_token_ids")
        cont = self._check_ids(req.get("continuation_ids"), "continuation_ids")
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        if not cont:
            return {"id": req["id"], "steps": []}
        k = max(1, int(req.get("top_logprobs", 1)))
        logits = self.np.asarray(self.generator.forward_batch([prompt + cont]))[0]
        n = len(prompt)
        lps = self._log_softmax(logits[n - 1 : n - 1 + len(cont)])
        return {"id": req["id"], "steps": [
            {"token_id": tok, "logprob": float(lps[j, tok]), "top": self._top(lps[j], k)} for j, tok in enumerate(cont)
        ]}


def serve(engine: CT2Engine, out, hello: dict) -> int:
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
    ap = argparse.ArgumentParser(description="CTranslate2 engine (strict-gate command protocol)")
    ap.add_argument("--model", type=Path, required=True, help="a model converted by scripts/convert_ctranslate2.py")
    ap.add_argument("--compute-type", default="float32", choices=COMPUTE_TYPES)
    ap.add_argument("--threads", type=int, default=1, help="CTranslate2 intra_threads (0: all cores)")
    args = ap.parse_args(argv)
    if not (args.model / "model.bin").is_file():
        log(f"{args.model}: no converted model; run: bash scripts/install-ctranslate2.sh")
        return 2
    import ctranslate2

    try:
        engine = CT2Engine(args.model, args.compute_type, args.threads)
    except SystemExit as e:
        log(str(e))
        return 2
    log(f"loaded {args.model}: compute type {engine.compute_type}, {args.threads} thread(s), EOS {sorted(engine.eos)}")
    hello = {
        "hello": PROTOCOL, "name": NAME, "version": VERSION, "model": str(args.model),
        "capabilities": ["generate", "score"], "versions": {"ctranslate2": ctranslate2.__version__},
        "settings": {"compute_type": engine.compute_type, "threads": args.threads, "eos": sorted(engine.eos),
                     "CT2_USE_MKL": os.environ.get("CT2_USE_MKL")},
    }
    try:
        return serve(engine, out, hello)
    except BrokenPipeError:  # the gate is gone: nobody to answer
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
