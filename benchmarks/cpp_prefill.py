"""The C++ engine's two prefill settings, bit for bit: the table of benchmarks/README.md ("C++ engine").

    bash scripts/build-cpp-engine.sh && .venv/bin/python benchmarks/cpp_prefill.py

On the 128 battery prompts (the ids of baselines/tiny-llama-vllm-fp32), 16 greedy tokens, top-5,
per --prefill setting: the prefill/decode consistency (score the engine's own continuation, the
prompt path, against the logprobs its generate reported, the decode path after the first token:
max |Δ| of the chosen token and how many positions differ at all), and between the settings:
same tokens, max |Δ| and the positions whose chosen logprob differs in any bit.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "cpp" / "engine"
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
BASELINE = ROOT / "baselines" / "tiny-llama-vllm-fp32" / "records.jsonl"


def session(prefill: str, requests: list[dict]) -> list[dict]:
    """One engine process: the requests in order, their replies (the hello dropped)."""
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    p = subprocess.run([str(BINARY), "--model", str(MODEL), "--prefill", prefill], input=lines,
                       capture_output=True, text=True, check=True)
    return [json.loads(line) for line in p.stdout.splitlines()[1:]]


def chosen(reply: dict) -> list[float]:
    return [dict(map(tuple, step))[t] for t, step in zip(reply["token_ids"], reply["top_logprobs"])]


def main() -> int:
    prompts = [json.loads(line) for line in BASELINE.read_text().splitlines() if line.strip()]
    gen = [{"op": "generate", "id": r["id"], "prompt_token_ids": r["prompt_token_ids"], "max_tokens": 16,
            "top_logprobs": 5, "eos_token_ids": [2]} for r in prompts]
    replies = {}
    print("| --prefill | score vs generate: max \\|Δ\\| (prompt, position) | positions differing |")
    print("|---|---|---|")
    for mode in ("batched", "stepwise"):
        g = session(mode, gen)
        sc = session(mode, [{"op": "score", "id": x["id"], "prompt_token_ids": r["prompt_token_ids"],
                             "continuation_ids": x["token_ids"], "top_logprobs": 5} for x, r in zip(g, prompts)])
        deltas = [(abs(s["logprob"] - lp), x["id"], i) for x, y in zip(g, sc)
                  for i, (s, lp) in enumerate(zip(y["steps"], chosen(x)))]
        worst = max(deltas)
        where = f"({worst[1]}, {worst[2]})" if worst[0] else ""
        print(f"| {mode} | {worst[0]:.2e} {where} | {sum(d > 0 for d, _, _ in deltas)}/{len(deltas)} |")
        replies[mode] = g
    a, b = replies["batched"], replies["stepwise"]
    same = sum(x["token_ids"] == y["token_ids"] for x, y in zip(a, b))
    d = [abs(p - q) for x, y in zip(a, b) if x["token_ids"] == y["token_ids"] for p, q in zip(chosen(x), chosen(y))]
    first = sum(chosen(x)[0] != chosen(y)[0] for x, y in zip(a, b))
    print(f"\nbatched vs stepwise: same tokens {same}/{len(a)}, chosen logprob max |Δ| {max(d):.2e}, "
          f"positions differing {sum(v > 0 for v in d)}/{len(d)} (first positions: {first}/{len(a)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
