#!/usr/bin/env python
"""Convert the bundled tiny Llama to CTranslate2 (float32, int8, int16) under build/ct2/.

Runs under the CTranslate2 environment (.venvs/ctranslate2, made by
scripts/install-ctranslate2.sh), with CTranslate2's own TransformersConverter: the weights
the engine loads are exactly what the converter makes of the checkpoint, never edited by
hand. generation_config.json is copied beside the weights because the adapter reads its EOS
ids from it (vLLM stops on them too). A conversion is redone only when the checkpoint or the
CTranslate2 version changed (a stamp file says what it was made from), and is written to a
temporary directory renamed into place, so an interrupted run never leaves a half model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
OUT = ROOT / "build" / "ct2"
QUANTIZATIONS = ("float32", "int8", "int16")
COPY = ("generation_config.json",)
STAMP = "strict-gate-conversion.json"


def source_digest(model: Path) -> dict[str, str]:
    """sha256 of every file of the checkpoint: what the conversion depends on."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model.iterdir()) if p.is_file()}


def convert(model: Path, out: Path, quantization: str) -> Path:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    dest = out / f"{model.name}-{quantization}"
    stamp = {"source": str(model), "files": source_digest(model), "quantization": quantization,
             "ctranslate2": ctranslate2.__version__}
    if (dest / STAMP).is_file() and json.loads((dest / STAMP).read_text()) == stamp:
        print(f"{dest}: up to date", file=sys.stderr)
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy = [str(model / f) for f in COPY if (model / f).is_file()]
    TransformersConverter(str(model), copy_files=copy).convert(str(tmp), quantization=quantization, force=True)
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"{dest}: converted ({quantization})", file=sys.stderr)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL, help="a transformers checkpoint directory")
    ap.add_argument("--out", type=Path, default=OUT, help="where the converted models go (default build/ct2)")
    ap.add_argument("--quantization", nargs="+", choices=QUANTIZATIONS, default=list(QUANTIZATIONS))
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        ap.error(f"{args.model}: no config.json (give a transformers checkpoint directory)")
    args.out.mkdir(parents=True, exist_ok=True)
    for q in args.quantization:
        convert(args.model.resolve(), args.out.resolve(), q)
    return 0


if __name__ == "__main__":
    sys.exit(main())
