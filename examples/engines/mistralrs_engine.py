#!/usr/bin/env python
"""A mistral.rs engine for strict-gate, over the command protocol (strict-gate/engine@1:
JSON lines on stdin/stdout, docs/engine-protocol.md).

It runs under mistral.rs's own interpreter (.venvs/mistralrs, made by
scripts/install-mistralrs.sh; the `mistralrs` CPU wheel), never strict-gate's: a gate names
that interpreter in its `command`. It loads a checkpoint prepared by
scripts/convert_mistralrs.py (safetensors, f32) and answers:

  generate  `Runner.send_chat_completion_request`, greedy (temperature 0), logprobs on: the
            tokens and their top-k logprobs as mistral.rs reports them. Its Python API takes
            text, not ids, so the prompt ids go through mistral.rs's own tokenizer: detokenized,
            re-tokenized and compared, a prompt whose ids do not come back is refused (an error
            for that prompt), and mistral.rs's prompt token count is checked against the ids.

It declares no `score`: mistral.rs has no teacher-forced scoring in its API.

Traps of mistral.rs 0.9.5 that this adapter handles:

  * rope_theta: mistral.rs refuses a config.json without a top-level `rope_theta` (transformers
    5 writes it in `rope_parameters`): scripts/convert_mistralrs.py writes a patched copy.
  * The chat template is applied to every request, also to a plain string: a pass-through
    template (the messages' content, nothing added) is given with `jinja_explicit`.
  * The KV cache on CPU is f16 by default ("Using f16 KV cache on CPU"), even for an f32
    model: MISTRALRS_CPU_KV_F32=1 is set before mistral.rs is imported (`--kv native` leaves
    mistral.rs's default; the hello says which ran).
  * Token ids out: each step's chosen token comes back as a string; its id is read from the
    step's top-k ids (the entry with the chosen token's text and logprob), and a step whose
    token is not among its own top-k is an error for that prompt (it would not be greedy).
  * EOS: mistral.rs stops on its own model's EOS set, and has no stop-by-id. The adapter asks for
    `ignore_eos` and ends the sequence itself at the first of the request's eos_token_ids (the
    set vLLM stops on), else of generation_config.json's: the EOS is kept in token_ids with
    finish_reason "stop". A request's own ignore_eos keeps every token.
  * Threads: candle runs on rayon; RAYON_NUM_THREADS is set from --threads before the import.

stdout carries only protocol lines (fd 1 is pointed at stderr, where mistral.rs logs too).
When stdin closes or stdout breaks (the gate died), the engine exits quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

PROTOCOL = "strict-gate/engine@1"
NAME = "mistralrs-example"
VERSION = "0.1.0"
PASS_THROUGH = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
ISQ = ("none", "Q8_0", "Q4_0", "Q4K", "Q6K", "Q8K")


def protocol_stdout():
    """Keep the real stdout for protocol lines; anything else printed goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def log(msg: str) -> None:
    print(f"mistralrs_engine: {msg}", file=sys.stderr, flush=True)


def model_eos(model_dir: Path) -> set[int]:
    ids: set[int] = set()
    for f in ("config.json", "generation_config.json"):
        if (model_dir / f).is_file():
            e = json.loads((model_dir / f).read_text()).get("eos_token_id")
            ids.update(e if isinstance(e, list) else [] if e is None else [e])
    if not ids:
        raise SystemExit(f"{model_dir}: no eos_token_id in config.json or generation_config.json")
    return ids


class MistralEngine:
    def __init__(self, model_dir: Path, isq: str):
        import mistralrs as mr

        self.mr = mr
        cfg = json.loads((model_dir / "config.json").read_text())
        if "rope_theta" not in cfg:
            raise SystemExit(f"{model_dir}/config.json has no rope_theta, which mistral.rs needs; "
                             "prepare the model with scripts/convert_mistralrs.py")
        self.vocab = int(cfg["vocab_size"])
        self.template = Path(tempfile.mkdtemp(prefix="mistralrs-engine-")) / "pass-through.jinja"
        self.template.write_text(PASS_THROUGH)
        self.runner = mr.Runner(
            which=mr.Which.Plain(model_id=str(model_dir), arch=mr.Architecture.Llama, dtype=mr.ModelDType.F32),
            jinja_explicit=str(self.template), in_situ_quant=None if isq == "none" else isq,
            max_seqs=1, prefix_cache_n=0, token_source="none",
        )
        self.eos = model_eos(model_dir)

    def _check_ids(self, ids, what: str) -> list[int]:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{what} must be a list of integers")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"{what} holds ids outside the vocabulary (size {self.vocab}): {bad[:5]}")
        return ids

    def _text(self, ids: list[int]) -> str:
        """The prompt as text that mistral.rs's tokenizer turns back into exactly these ids."""
        text = self.runner.detokenize_text(ids, False)
        back = self.runner.tokenize_text(text, False, None)
        if list(back) != ids:
            raise ValueError(f"the prompt ids do not survive mistral.rs's text round trip (its API takes text): "
                             f"{len(ids)} ids came back as {len(back)}")
        return text

    @staticmethod
    def _chosen(step, i: int) -> int:
        hits = {t.token for t in step.top_logprobs if t.bytes == step.token and t.logprob == step.logprob}
        if len(hits) != 1:
            raise RuntimeError(f"step {i}: the chosen token {step.token!r} ({step.logprob}) is "
                               f"{'not among' if not hits else 'ambiguous in'} its own top-k")
        return hits.pop()

    def generate(self, req: dict) -> dict:
        ids = self._check_ids(req.get("prompt_token_ids"), "prompt_token_ids")
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        max_tokens, k = int(req.get("max_tokens", 16)), int(req.get("top_logprobs", 0))
        eos = set(self._check_ids(req["eos_token_ids"], "eos_token_ids")) if req.get("eos_token_ids") else self.eos
        res = self.runner.send_chat_completion_request(self.mr.ChatCompletionRequest(
            messages=[{"role": "user", "content": self._text(ids)}], model="default", max_tokens=max_tokens,
            temperature=0.0, logprobs=True, top_logprobs=max(k, 1), ignore_eos=True))
        if res.usage.prompt_tokens != len(ids):
            raise RuntimeError(f"mistral.rs saw {res.usage.prompt_tokens} prompt tokens, the request sent {len(ids)}")
        steps = res.choices[0].logprobs.content or []
        toks = [self._chosen(s, i) for i, s in enumerate(steps)]
        if not req.get("ignore_eos"):
            cut = next((i for i, t in enumerate(toks) if t in eos), None)
            toks, steps = (toks, steps) if cut is None else (toks[: cut + 1], steps[: cut + 1])
        if not toks:
            raise RuntimeError("mistral.rs returned no token")
        tops = [[[int(t.token), float(t.logprob)] for t in s.top_logprobs][:k] for s in steps]
        tops = [top if tok in {t for t, _ in top} else top + [[tok, float(s.logprob)]]
                for top, tok, s in zip(tops, toks, steps)]
        u = res.usage
        return {
            "id": req["id"], "prompt_token_ids": ids, "token_ids": toks,
            "finish_reason": "stop" if toks[-1] in eos and not req.get("ignore_eos") else "length",
            "top_logprobs": tops,
            "timing": {"total_s": float(u.total_time_sec), "ttft_s": float(u.total_prompt_time_sec)},
        }


def serve(engine: MistralEngine, out, hello: dict) -> int:
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
            resp = engine.generate(req) if op == "generate" else None
        except Exception as e:  # this request fails; the engine goes on
            log(f"{rid}: {type(e).__name__}: {e}")
            resp = {"id": rid, "error": f"{type(e).__name__}: {e}"}
        send(resp or {"id": rid, "error": f"unknown op {op!r}"})
    return 0


def main(argv: list[str] | None = None) -> int:
    out = protocol_stdout()
    ap = argparse.ArgumentParser(description="mistral.rs engine (strict-gate command protocol)")
    ap.add_argument("--model", type=Path, required=True, help="a checkpoint prepared by scripts/convert_mistralrs.py")
    ap.add_argument("--isq", default="none", choices=ISQ, help="mistral.rs in-situ quantisation at load (none: f32)")
    ap.add_argument("--kv", default="f32", choices=("f32", "native"),
                    help="f32: MISTRALRS_CPU_KV_F32=1 (default); native: mistral.rs's f16 KV cache on CPU")
    ap.add_argument("--threads", type=int, default=1, help="RAYON_NUM_THREADS (0: rayon's choice)")
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        log(f"{args.model}: no prepared model; run: bash scripts/install-mistralrs.sh")
        return 2
    if args.kv == "f32":
        os.environ["MISTRALRS_CPU_KV_F32"] = "1"
    if args.threads:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    from importlib.metadata import version

    try:
        engine = MistralEngine(args.model, args.isq)
    except SystemExit as e:
        log(str(e))
        return 2
    log(f"loaded {args.model}: isq {args.isq}, KV {args.kv}, {args.threads} thread(s), EOS {sorted(engine.eos)}")
    hello = {
        "hello": PROTOCOL, "name": NAME, "version": VERSION, "model": str(args.model),
        "capabilities": ["generate"], "versions": {"mistralrs": version("mistralrs")},
        "settings": {"dtype": "f32", "isq": args.isq, "kv": args.kv, "threads": args.threads,
                     "MISTRALRS_CPU_KV_F32": os.environ.get("MISTRALRS_CPU_KV_F32"), "eos": sorted(engine.eos)},
        "dtype": "float32" if args.isq == "none" else args.isq.lower(), "eager": True, "prefix_cache": False,
    }
    try:
        return serve(engine, out, hello)
    except BrokenPipeError:  # the gate is gone: nobody to answer
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
