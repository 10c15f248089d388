"""A working directory laid out as a user's: the shipped toy baselines (vLLM fp32 and bf16, K = 5)
and battery, and gate configs beside them with relative paths. No engine is started: the
reference and candidate are the stored runs, the K runs their captured samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

ROOT = Path(__file__).resolve().parent.parent
FP32, BF16 = "tiny-llama-vllm-fp32", "tiny-llama-vllm-bf16"


def layout(tmp: Path) -> Path:
    """tmp/baselines/{fp32,bf16}, tmp/prompts/battery-128.jsonl, tmp/gates/; returns tmp."""
    for name in (FP32, BF16):
        shutil.copytree(ROOT / "baselines" / name, tmp / "baselines" / name,
                        ignore=shutil.ignore_patterns("noise.json"))
    (tmp / "prompts").mkdir()
    shutil.copy(ROOT / "prompts" / "battery-128.jsonl", tmp / "prompts")
    (tmp / "gates").mkdir()
    return tmp


def recorded(name: str, model: str = "bundled:tiny-llama") -> dict:
    return {"kind": "recorded", "path": f"../baselines/{name}", "model": model}


def gate(tmp: Path, file: str = "gate.toml", *, reference: str = FP32, candidate: str | None = BF16,
         **top) -> Path:
    """A gate over the stored runs (no diagnosis: nothing to re-score with)."""
    keys = {"prompts": "../prompts/battery-128.jsonl", "max_tokens": 16, "top_logprobs": 5, "policy": "near-tie",
            "diagnose": False, "output_dir": "reports", "name": Path(file).stem} | top
    return write_gate(tmp / "gates", reference=recorded(reference),
                      candidate=recorded(candidate) if candidate else None, file=file, **keys)


def records(base: Path) -> list[dict]:
    return [json.loads(line) for line in (base / "records.jsonl").read_text().splitlines()]


def rewrite(base: Path, recs: list[dict], manifest: dict | None = None) -> None:
    """Write a baseline's records (and manifest) back, as a hand or a hostile tool would."""
    (base / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if manifest is not None:
        (base / "manifest.json").write_text(json.dumps(manifest, indent=2))


def plant_self_flip(base: Path, pid: str = "prose-001") -> tuple[int, float]:
    """Make the reference disagree with itself honestly: one later sample of `pid` takes the
    golden's runner-up at the first step where it is in the top-k, the determinism summary says
    so. Returns (position, the golden's gap there)."""
    recs = records(base)
    rec = next(r for r in recs if r["id"] == pid)
    pos, top = next((i, t) for i, t in enumerate(rec["top_logprobs"]) if len(t) >= 2)
    sample = list(rec["token_ids"][:pos]) + [top[1][0]]
    rec["samples"][-1] = sample
    manifest = json.loads((base / "manifest.json").read_text())
    det = manifest["determinism"]
    det["prompts_deterministic"] -= 1
    det["non_deterministic"] = [{"id": pid, "distinct_sequences": 2, "positions": [
        {"position": pos, "tokens": sorted({rec["token_ids"][pos], top[1][0]}), "ended": False}]}]
    rewrite(base, recs, manifest)
    return pos, top[0][1] - top[1][1]


def cli(*args: str):
    """`strict-gate ARGS` in process, exceptions raised (a traceback is a failure, not an exit code)."""
    return CliRunner().invoke(app, list(args), catch_exceptions=False)
