#!/usr/bin/env python
"""Build the tiny demo Llama that strict-gate's examples and tests run on.

Everything is made here, from text that ships with a Debian system (the
license texts under /usr/share/common-licenses), so nothing is downloaded:

1. a byte-level BPE tokenizer (``tokenizers``), whose post-processor puts
   ``<s>`` (BOS) in front of every encoding, so transformers and vLLM build
   the same prompt ids;
2. a tiny ``LlamaForCausalLM`` (hidden 128, head_dim 64, tied embeddings),
   seeded;
3. a short AdamW training run on the same text, so that the model's
   next-token distributions are peaked like a real model's (a random model is
   all near-ties, which makes a token-equality gate meaningless);
4. ``save_pretrained`` in float32 (safetensors) plus ``generation_config.json``,
   the tokenizer files and a ``BUILD.md`` that records how it was made.

Reproducibility: the corpus order, the tokenizer, the initialisation and the
batch sampling are all seeded. With ``--minutes`` the number of steps is fixed
after timing the first steps (it depends on the machine); BUILD.md records the
step count, and ``--steps N --minutes 0`` rebuilds it exactly (bitwise, on the
same machine and library versions). The time probe counts whatever else is
running on the machine, so on a busy machine ``--minutes`` picks few steps; the
shipped model was built with ``--steps 1200 --minutes 0`` (see its BUILD.md).

Usage::

    python scripts/build_demo_model.py --steps 1200 --minutes 0   # the shipped model
    python scripts/build_demo_model.py                      # ~4 minutes of steps
    python scripts/build_demo_model.py --out /tmp/m --minutes 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

DEFAULT_OUT = "strict_gate/models/tiny-llama"
LICENSE_DIR = Path("/usr/share/common-licenses")

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0, 1, 2, 3
UNK, BOS, EOS, PAD = SPECIAL_TOKENS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default %(default)s)")
    p.add_argument("--minutes", type=float, default=4.0,
                   help="training time budget in minutes (default %(default)s); "
                        "used to choose the step count unless --steps is given")
    p.add_argument("--steps", type=int, default=None,
                   help="exact number of training steps (caps the --minutes estimate)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128, help="tokens per training sample after <s>")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--corpus-dir", default=str(LICENSE_DIR))
    return p.parse_args(argv)


def read_corpus(corpus_dir: Path) -> list[tuple[str, str]]:
    """Regular files of corpus_dir, sorted by name; symlinks (GPL -> GPL-3, ...)
    are skipped so no text is counted twice."""
    docs = []
    for path in sorted(corpus_dir.iterdir(), key=lambda q: q.name):
        if path.is_symlink() or not path.is_file():
            continue
        docs.append((path.name, path.read_text(encoding="utf-8", errors="replace")))
    if not docs:
        raise SystemExit(f"no text files found in {corpus_dir}")
    return docs


def build_tokenizer(docs, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text for _, text in docs], trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0",
        pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    return tok


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()

    import numpy as np
    import tokenizers
    import torch
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    out = Path(args.out)
    docs = read_corpus(Path(args.corpus_dir))
    n_chars = sum(len(t) for _, t in docs)
    print(f"corpus: {len(docs)} files, {n_chars} chars from {args.corpus_dir}", flush=True)

    # ---- tokenizer -------------------------------------------------------
    tok = build_tokenizer(docs, args.vocab_size)
    ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
    assert ids == {UNK: 0, BOS: 1, EOS: 2, PAD: 3}, ids
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    vocab_size = tok.get_vocab_size()
    print(f"tokenizer: vocab {vocab_size}", flush=True)

    # Token stream: each document as <s> text </s>. A training sample is <s>
    # followed by a random window of the stream, which is what a prompt looks
    # like at inference time (BOS, then text from anywhere).
    stream = []
    for _, text in docs:
        stream.append(ids[BOS])
        stream.extend(tok.encode(text, add_special_tokens=False).ids)
        stream.append(ids[EOS])
    stream_t = torch.tensor(stream, dtype=torch.long)
    print(f"corpus tokens: {len(stream)} ({n_chars / len(stream):.2f} chars/token)", flush=True)

    # ---- model -----------------------------------------------------------
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=args.layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,  # vLLM's CPU attention backend rejects head_dim 16; 64 works
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=True,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        torch_dtype="float32",
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).float()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.layers} layers, {n_params} parameters", flush=True)

    # ---- training --------------------------------------------------------
    gen = torch.Generator().manual_seed(args.seed)
    L = args.seq_len
    max_start = len(stream) - L

    def batch():
        starts = torch.randint(0, max_start, (args.batch_size,), generator=gen)
        win = torch.stack([stream_t[s:s + L] for s in starts.tolist()])
        bos = torch.full((args.batch_size, 1), ids[BOS], dtype=torch.long)
        x = torch.cat([bos, win], dim=1)  # (B, L+1)
        return x[:, :-1], x[:, 1:]

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.01, eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()

    def lr_at(step, total):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = (step - args.warmup) / max(1, total - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, prog))))

    def train_step(step, total):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total)
        x, y = batch()
        logits = model(input_ids=x).logits
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    model.train()
    budget_s = args.minutes * 60.0
    # The schedule needs the total up front. With --steps it is exact; else time
    # a few steps (which are part of the run: they use the warm-up LR, which
    # does not depend on the total) and fit the total into the budget.
    probe = min(20, args.warmup)  # warm-up LR does not depend on the total
    t_train = time.time()
    losses = []
    if args.steps is not None and args.minutes <= 0:
        total = args.steps
    elif probe == 0:
        raise SystemExit("--minutes needs --warmup >= 1 (or give --steps with --minutes 0)")
    else:
        for step in range(min(probe, args.steps or probe)):
            losses.append(train_step(step, args.warmup + 1))  # warm-up LR only
        per_step = (time.time() - t_train) / len(losses)
        total = max(len(losses), int(budget_s / per_step))
        if args.steps is not None:
            total = min(total, args.steps)
        print(f"{per_step * 1000:.0f} ms/step -> {total} steps in {args.minutes:g} min", flush=True)
    for step in range(len(losses), total):
        losses.append(train_step(step, total))
        if step % 50 == 0 or step == total - 1:
            recent = losses[-50:]
            print(f"step {step:5d}/{total}  lr {lr_at(step, total):.2e}  "
                  f"loss {losses[-1]:.4f}  (mean last {len(recent)}: {sum(recent) / len(recent):.4f})  "
                  f"{time.time() - t_train:6.1f}s", flush=True)
    train_s = time.time() - t_train
    final_loss = sum(losses[-50:]) / len(losses[-50:])

    # ---- save ------------------------------------------------------------
    model.eval()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    # transformers 5 writes tokenizer_class "TokenizersBackend", which 4.x
    # cannot load; "PreTrainedTokenizerFast" names the same class in 5.x and
    # loads in 4.x too. 5.x also no longer writes special_tokens_map.json;
    # write it for older loaders.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.setdefault("add_bos_token", False)  # the post-processor adds <s>; no second one
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD},
        indent=2) + "\n", encoding="utf-8")
    GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD], do_sample=False,
    ).save_pretrained(out)

    # Sanity: the saved tokenizer prepends <s> when loaded back.
    from transformers import AutoTokenizer
    back = AutoTokenizer.from_pretrained(out)
    enc = back("Permission is hereby granted").input_ids
    assert enc[0] == ids[BOS] and enc.count(ids[BOS]) == 1, enc

    wall_s = time.time() - t_start
    cmd = " ".join(["python", "scripts/build_demo_model.py", "--out", str(args.out),
                    "--steps", str(total), "--minutes", "0", "--seed", str(args.seed),
                    "--vocab-size", str(args.vocab_size), "--layers", str(args.layers)])
    build_md = f"""# tiny-llama (strict-gate demo model)

Built by `scripts/build_demo_model.py`; nothing downloaded. A tiny
`LlamaForCausalLM` with a byte-level BPE tokenizer, both trained on the license
texts of {args.corpus_dir} ({len(docs)} regular files read in name order,
symlinks skipped; {n_chars} characters, {len(stream)} tokens).

It writes license-like English; on anything else it is a small model.

| | |
|---|---|
| command run | `{' '.join(['python'] + sys.argv)}` |
| rebuild exactly | `{cmd}` |
| seed | {args.seed} |
| tokenizer | byte-level BPE, vocab {vocab_size}; `<unk>`=0 `<s>`=1 `</s>`=2 `<pad>`=3; encoding prepends `<s>` (TemplateProcessing) |
| model | Llama, {args.layers} layers, hidden 128, 2 heads x head_dim 64, 2 KV heads, intermediate 384, max positions 512, tied embeddings, {n_params} parameters, float32 |
| training | AdamW (betas 0.9/0.95, wd 0.01), lr {args.lr:g}, {args.warmup} warm-up steps then cosine to 10%, batch {args.batch_size} x {args.seq_len} tokens (each sample `<s>` + a random window), grad clip 1.0, {args.threads} torch threads |
| steps | {total} |
| final loss | {final_loss:.4f} (mean of the last {len(losses[-50:])} steps) |
| training time | {train_s:.1f} s |
| wall time | {wall_s:.1f} s |
| machine | {platform.machine()}, {platform.system()}, {os.cpu_count()} CPUs |
| python | {platform.python_version()} |
| torch | {torch.__version__} |
| transformers | {transformers.__version__} |
| tokenizers | {tokenizers.__version__} |
| numpy | {np.__version__} |

Training on another machine or library version can give different weights;
the gate compares engines on the same weights, so that does not matter to it.
"""
    (out / "BUILD.md").write_text(build_md, encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"saved to {out} ({size / 1e6:.2f} MB) in {wall_s:.1f} s; "
          f"{total} steps, final loss {final_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
