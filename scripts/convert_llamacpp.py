#!/usr/bin/env python
"""Convert an HF Llama (default: the bundled tiny-llama) to GGUF F32, F16, Q8_0 with llama.cpp's tools.

Run under the llama.cpp venv (.venvs/llamacpp, made by scripts/install-llamacpp.sh), which
holds llama-cpp-python, gguf-py and a CPU torch. F32 and F16 come from llama.cpp's
convert_hf_to_gguf.py, taken from the llama-cpp-python sdist the wheel was built from (so the
writer matches the reader); Q8_0 is quantized from the F32 file by llama.cpp's C++ quantizer
(llama_model_quantize, what `llama-quantize` runs), the way GGUF quants are usually made.

Why the wrapper: the converter names the BPE pre-tokenizer by hashing the tokens of a fixed
text and looking the hash up in a table of known HF models; a tokenizer it has never seen
(the bundled one, trained by scripts/build_demo_model.py) is refused ("BPE pre-tokenizer was
not recognized"). The bundled tokenizer's pre-tokenizer is plain ByteLevel with the GPT-2
split regex, which is llama.cpp's "gpt-2" pre-tokenizer. The wrapper checks exactly that in
tokenizer.json and only then answers "gpt-2" for the unknown hash; any other tokenizer is
still refused. (The gate sends token ids, so the engine never tokenizes; the mapping matters
for llama.cpp's own tokenizer, which tests/test_llamacpp_engine.py compares with the HF one.)
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
OUT = ROOT / "build" / "gguf"
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json")


def is_gpt2_byte_level(tokenizer_json: Path) -> bool:
    """True when the pre-tokenizer is ByteLevel + GPT-2 regex, and nothing else (no normalizer)."""
    tok = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    pre = tok.get("pre_tokenizer") or {}
    return (tok.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) is True and pre.get("add_prefix_space") is False
            and (tok.get("model") or {}).get("type") == "BPE")


def convert(src: Path, model: Path, outtype: str, outfile: Path) -> None:
    """Run convert_hf_to_gguf.py in this process, its pre-tokenizer lookup extended (see above)."""
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    from conversion.base import TextModel  # llama.cpp's converter package

    known = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            if is_gpt2_byte_level(Path(self.dir_model) / "tokenizer.json"):
                print("convert_llamacpp: unknown BPE hash; tokenizer.json is ByteLevel + GPT-2 regex "
                      "-> pre-tokenizer 'gpt-2'", file=sys.stderr)
                return "gpt-2"
            raise

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(model), "--outtype", outtype, "--outfile", str(outfile)]
    try:
        runpy.run_path(str(src / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv


def quantize_q8_0(f32: Path, outfile: Path) -> None:
    """llama.cpp's own Q8_0 quantizer (llama_model_quantize), from the F32 file."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(outfile).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({f32} -> {outfile}) returned {rc}")


def stamp(model: Path, src: Path) -> str:
    """What the GGUFs were made from: the model files and the llama.cpp source tree's name."""
    h = hashlib.sha256(src.parent.parent.name.encode())
    for name in MODEL_FILES:
        p = model / name
        if p.exists():
            h.update(name.encode() + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp-src", type=Path, required=True,
                    help="vendor/llama.cpp of the llama-cpp-python sdist (install-llamacpp.sh keeps it in the cache)")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--force", action="store_true", help="convert even when the stamp says the files are current")
    args = ap.parse_args(argv)
    src = args.llama_cpp_src.resolve()
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{src}/convert_hf_to_gguf.py not found: run bash scripts/install-llamacpp.sh")
    args.out.mkdir(parents=True, exist_ok=True)
    want = stamp(args.model, src)
    stamp_file = args.out / f"{args.model.resolve().name}.stamp"
    files = {t: args.out / f"{args.model.resolve().name}-{t}.gguf" for t in ("f32", "f16", "q8_0")}
    if not args.force and stamp_file.is_file() and stamp_file.read_text().strip() == want \
            and all(p.is_file() for p in files.values()):
        print(f"convert_llamacpp: {args.out} is current", file=sys.stderr)
        return 0
    stamp_file.unlink(missing_ok=True)
    for t in ("f32", "f16"):
        convert(src, args.model, t, files[t])
    quantize_q8_0(files["f32"], files["q8_0"])
    stamp_file.write_text(want + "\n")
    for p in files.values():
        print(f"convert_llamacpp: wrote {p} ({p.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
