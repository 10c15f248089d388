#!/usr/bin/env python
"""Prepare a Llama checkpoint for mistral.rs under build/mistralrs/ (no weights are rewritten).

mistral.rs 0.9.5 reads the rope base from config.json's top-level `rope_theta` and refuses a
config without it, while transformers 5 writes it inside `rope_parameters` (as `strict-gate
model convert` does). This script makes build/mistralrs/<name>/: config.json with
`rope_theta` copied up from `rope_parameters` (nothing else changed), and symbolic links to
every other file of the checkpoint (the weights stay where they are). Quantisation (Q8_0) is
mistral.rs's own in-situ quantisation at load time (the adapter's --isq), not a file.
Idempotent: redone only when the checkpoint's config.json changed. Runs under any Python 3.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
OUT = ROOT / "build" / "mistralrs"


def patched_config(model: Path) -> dict:
    cfg = json.loads((model / "config.json").read_text())
    if "rope_theta" not in cfg:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
        if theta is None:
            raise SystemExit(f"{model}/config.json: neither rope_theta nor rope_parameters.rope_theta")
        cfg["rope_theta"] = theta
    return cfg


def prepare(model: Path, out: Path) -> Path:
    dest = out / model.name
    cfg = json.dumps(patched_config(model), indent=2) + "\n"
    links_ok = all((dest / p.name).resolve() == p.resolve() for p in model.iterdir()
                   if p.is_file() and p.name != "config.json")
    if (dest / "config.json").is_file() and (dest / "config.json").read_text() == cfg and links_ok:
        print(f"{dest}: up to date", file=sys.stderr)
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p in sorted(model.iterdir()):
        if p.is_file() and p.name != "config.json":
            (tmp / p.name).symlink_to(p.resolve())
    (tmp / "config.json").write_text(cfg)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"{dest}: prepared (config.json with rope_theta, links to {model})", file=sys.stderr)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL, help="a transformers checkpoint directory")
    ap.add_argument("--out", type=Path, default=OUT, help="where the prepared folder goes (default build/mistralrs)")
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        ap.error(f"{args.model}: no config.json (give a transformers checkpoint directory)")
    args.out.mkdir(parents=True, exist_ok=True)
    prepare(args.model.resolve(), args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
