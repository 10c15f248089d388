#!/usr/bin/env python
"""Build the tiny Kimi-Linear model that the KDA example engine runs on.

A ``KimiLinearForCausalLM`` (transformers 5.x) made from a config with a fixed seed,
RANDOM WEIGHTS (no training): 4 layers, three KDA linear-attention layers then one MLA
layer (Kimi-Linear's 3:1 pattern), hidden 128, KDA with 2 heads of head dim 64, a dense MLP
in layer 0 and a small MoE (4 routed experts, 2 per token, 1 shared) in layers 1-3.

The tokenizer is the bundled demo tokenizer (``strict_gate/models/tiny-llama``), copied
as is, so prompt ids and vocab_size agree with the tiny Llama. When that model has not
been built yet, ``--tokenizer-from train`` trains the same byte-level BPE with
``scripts/build_demo_model.py``'s own function (same corpus, same settings).

A random model is all near-ties (top-2 margins well under 0.5 nats), which is what this
model is for: showing that the chunk-vs-recurrent reduction order of the KDA prompt pass
moves logits and can flip a greedy token. It is not a model to judge text by.

Usage::

    python scripts/build_kda_model.py                      # -> examples/models/tiny-kimi-linear
    python scripts/build_kda_model.py --out /tmp/kda --seed 7
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "examples/models/tiny-kimi-linear"
DEFAULT_TOKENIZER = ROOT / "strict_gate/models/tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MAX_MB = 8.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--tokenizer-from", default=str(DEFAULT_TOKENIZER),
                   help="a model dir whose tokenizer files are copied, or 'train' (default %(default)s)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--kda-heads", type=int, default=2)
    p.add_argument("--kda-head-dim", type=int, default=64)
    p.add_argument("--mla-dims", type=int, nargs=3, default=(32, 16, 32), metavar=("NOPE", "ROPE", "V"),
                   help="MLA head dims qk_nope, qk_rope, v (default %(default)s; Kimi-Linear's own, which vLLM's "
                        "MLA prefill backends need: 128 64 128)")
    p.add_argument("--kv-lora-rank", type=int, default=64, help="MLA latent rank (default %(default)s; Kimi's: 512)")
    p.add_argument("--mla-use-nope", action="store_true",
                   help='write "mla_use_nope": true (vLLM asserts it; transformers\' MLA is NoPE either way)')
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="storage dtype of the safetensors file (default %(default)s)")
    return p.parse_args(argv)


def tokenizer_files(source: str, out: Path) -> None:
    """Put tokenizer.json (+ config files) into out, copied or trained."""
    if source != "train":
        src = Path(source)
        if not (src / "tokenizer.json").is_file():
            raise SystemExit(
                f"{src}/tokenizer.json not found: build the demo model first "
                "(python scripts/build_demo_model.py) or pass --tokenizer-from train"
            )
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, out / name)
        return
    spec = importlib.util.spec_from_file_location("build_demo_model", ROOT / "scripts/build_demo_model.py")
    bdm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bdm)
    from transformers import PreTrainedTokenizerFast

    defaults = bdm.parse_args([])
    tok = bdm.build_tokenizer(bdm.read_corpus(Path(defaults.corpus_dir)), defaults.vocab_size)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bdm.BOS, eos_token=bdm.EOS, unk_token=bdm.UNK, pad_token=bdm.PAD
    )
    hf_tok.save_pretrained(out)
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.setdefault("add_bos_token", False)
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": bdm.BOS, "eos_token": bdm.EOS, "unk_token": bdm.UNK, "pad_token": bdm.PAD}, indent=2
    ) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    import tokenizers
    import torch
    import transformers
    from transformers import GenerationConfig, KimiLinearConfig, KimiLinearForCausalLM

    nope, rope, v_dim = args.mla_dims
    nope_note = '; `"mla_use_nope": true` in config.json' if args.mla_use_nope else ""
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tokenizer_files(args.tokenizer_from, out)
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<pad>")}
    if None in ids.values():
        raise SystemExit(f"tokenizer lacks a special token: {ids}")

    config = KimiLinearConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,  # the dense MLP of layer 0
        moe_intermediate_size=args.hidden // 2,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        # MLA (layer 3): 2 heads, a NoPE part + a shared "rope" part (unrotated: NoPE), values, a latent rank
        num_attention_heads=2,
        num_key_value_heads=2,
        kv_lora_rank=args.kv_lora_rank,
        q_lora_rank=None,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v_dim,
        # KDA (layers 0-2)
        linear_num_heads=args.kda_heads,
        linear_head_dim=args.kda_head_dim,
        linear_conv_kernel_dim=4,
        # MoE
        num_local_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        dtype=args.dtype,
        **({"mla_use_nope": True} if args.mla_use_nope else {}),
    )
    torch.manual_seed(args.seed)
    model = KimiLinearForCausalLM(config).eval()
    n_params = sum(p.numel() for p in model.parameters())
    model.to(getattr(torch, args.dtype)).save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"], do_sample=False
    ).save_pretrained(out)

    # Sanity: it loads back and generates greedily.
    back = KimiLinearForCausalLM.from_pretrained(out, dtype=torch.float32)
    prompt = torch.tensor([tok.encode("Permission is hereby granted").ids])
    with torch.inference_mode():
        gen = back.generate(prompt, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] == prompt.shape[1] + 4, gen.shape
    size_mb = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    if size_mb > MAX_MB:
        raise SystemExit(f"{out} is {size_mb:.1f} MB (> {MAX_MB} MB): reduce the size")

    if args.tokenizer_from == "train":
        tok_from = "trained with scripts/build_demo_model.py's build_tokenizer (same corpus and settings)"
    else:
        src = Path(args.tokenizer_from).resolve()
        tok_from = f"copied from `{src.relative_to(ROOT) if src.is_relative_to(ROOT) else src}`"
    flags = [] if (nope, rope, v_dim, args.kv_lora_rank) == (32, 16, 32, 64) else [
        "--mla-dims", str(nope), str(rope), str(v_dim), "--kv-lora-rank", str(args.kv_lora_rank)]
    flags += ["--mla-use-nope"] if args.mla_use_nope else []
    cmd = " ".join(["python", "scripts/build_kda_model.py", "--seed", str(args.seed), "--dtype", args.dtype, *flags])
    (out / "BUILD.md").write_text(f"""# tiny-kimi-linear (strict-gate KDA example model)

Built by `scripts/build_kda_model.py`; nothing downloaded. **Random weights**
(seeded initialisation, no training): every next-token distribution is nearly
flat, so most greedy steps are near-ties. It exists to show how the KDA prompt
pass's reduction order (chunked vs recurrent) moves logits and flips near-ties,
as in the seed's Kimi-Linear port; it does not write text.

| | |
|---|---|
| rebuild | `{cmd}` |
| seed | {args.seed} |
| tokenizer | {tok_from} (byte-level BPE, vocab {vocab}; `<s>`={ids['<s>']} prepended) |
| layers | 4: KDA, KDA, KDA, MLA (`layer_types`); MLP dense in layer 0, MoE in 1-3 |
| hidden | {args.hidden} |
| KDA | {args.kda_heads} heads x head dim {args.kda_head_dim}, short conv 4 |
| MLA | 2 heads, qk_nope {nope} + qk_rope {rope}, v {v_dim}, kv_lora_rank {args.kv_lora_rank}, no q LoRA{nope_note} |
| MoE | 4 routed experts (2 per token, intermediate {args.hidden // 2}) + 1 shared |
| parameters | {n_params} |
| stored dtype | {args.dtype} (safetensors) |
| size | {size_mb:.2f} MB |
| wall time | {time.time() - t0:.1f} s |
| machine | {platform.machine()}, {platform.system()}, {os.cpu_count()} CPUs |
| python | {platform.python_version()} |
| torch | {torch.__version__} |
| transformers | {transformers.__version__} |
| tokenizers | {tokenizers.__version__} |
""", encoding="utf-8")
    print(f"wrote {out}: {n_params} parameters, {size_mb:.2f} MB, {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
