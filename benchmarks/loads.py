"""Engine loads per gate: how many times one gate run loads a model, per library.

A gate is meant to load each arm once, and a nightly gate against a stored baseline to load
no reference at all (the [rescorer] only when something diverged). This counts it instead of
trusting it: transformers' `from_pretrained` of a causal LM and `vllm.LLM()` are wrapped for
the duration of one `run_gate` in this process, then the gate's verdict and the counts are
printed as a markdown row.

    PYTHONPATH=. .venv/bin/python benchmarks/loads.py gates/hf-vs-vllm-fp32.toml gates/demo.toml
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path


def count_loads(counts: Counter) -> None:
    """Wrap every model constructor a gate can call, counting calls under the library's name."""
    import transformers

    cls = transformers.AutoModelForCausalLM
    original = cls.from_pretrained.__func__

    @functools.wraps(original)
    def hf_load(klass, *args, **kwargs):
        counts["hf from_pretrained"] += 1
        return original(klass, *args, **kwargs)

    cls.from_pretrained = classmethod(hf_load)
    try:
        import vllm
    except ImportError:
        return
    llm_init = vllm.LLM.__init__

    @functools.wraps(llm_init)
    def vllm_load(self, *args, **kwargs):
        counts["vllm LLM()"] += 1
        return llm_init(self, *args, **kwargs)

    vllm.LLM.__init__ = vllm_load


def one_gate(config: Path, output_dir: Path) -> dict:
    """Run one gate with the counters on; its verdict, who re-scored, and the loads."""
    from strict_gate.gate.config import load_gate_config
    from strict_gate.gate.run import run_gate

    counts: Counter = Counter()
    count_loads(counts)
    cfg = load_gate_config(config)
    outcome = run_gate(cfg, output_dir=output_dir)
    result = outcome.result
    return {
        "gate": config.name,
        "reference": cfg.reference.kind,
        "candidate": cfg.candidate.kind,
        "rescorer": cfg.rescorer.kind if cfg.rescorer else "-",
        "verdict": "pass" if result.exit_code == 0 else f"exit {result.exit_code}",
        "diverged": sum(1 for p in result.comparison.prompts if p.status in ("divergent", "near_tie")),
        "rescored_by": result.rescored_by or "-",
        "hf": counts["hf from_pretrained"],
        "vllm": counts["vllm LLM()"],
        "report_dir": str(outcome.report_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", type=Path, help="gate TOML files, one gate each, each in its own process")
    ap.add_argument("-o", "--output-dir", type=Path, default=None, help="where reports go (default: a temp dir)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child: one gate, JSON out
    args = ap.parse_args()
    out = args.output_dir or Path(tempfile.mkdtemp(prefix="strict-gate-loads-"))
    if args.one:
        print(json.dumps(one_gate(args.configs[0], out)))
        return
    rows = []
    for config in args.configs:  # a fresh process per gate: counters and loaded libraries start clean
        child = subprocess.run([sys.executable, __file__, "--one", str(config), "-o", str(out)],
                               stdout=subprocess.PIPE, text=True, check=True)
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    print("| gate | reference | candidate | [rescorer] | verdict | prompts diverged | re-scored by "
          "| hf `from_pretrained` | `vllm.LLM()` |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['gate']}` | {r['reference']} | {r['candidate']} | {r['rescorer']} | {r['verdict']} "
              f"| {r['diverged']} | {r['rescored_by']} | {r['hf']} | {r['vllm']} |")
    for r in rows:
        print(f"<!-- {r['gate']}: {r['report_dir']} -->")


if __name__ == "__main__":
    main()
