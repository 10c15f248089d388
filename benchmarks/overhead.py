"""The gate's own cost: one arm through the gate against the same engine calls made bare.

"Bare" is what a user would write without the gate, on the very model object the gate
loaded (same process, same weights, same threads, same batch of 1, same pre-tokenised ids):

- hf: `model.generate(greedy, max_new_tokens=T, output_logits=True, return_dict_in_generate=True)`
  then one log_softmax + topk over the stacked logits and `.tolist()` (top-k is what the gate
  records, so bare computes it too); `bare (tokens only)` drops the logits, for scale.
- vllm: `LLM.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=T,
  logprobs=k))`, one prompt per call like the gate's reference setting.

"Gate" is `runner.run_arm` on the started engine: generation, logprob extraction, record
building, the run audit, writing records.jsonl and the manifest, reading the run back.
Repetitions interleave bare and gate (order alternating), after one untimed warm-up of each;
the table gives medians and the ratio gate/bare. Per-gate costs (tokenising the prompt set,
comparing two runs, writing the four reports) are timed once and shown apart, with the
whole-gate ratio they give. Sections of the gate arm are timed by wrapping the functions that
do them (a few microseconds per call); what is left is extraction and record building.

    PYTHONPATH=. .venv/bin/python benchmarks/overhead.py --engines hf vllm --max-tokens 16 128 \\
        --reps 3 --md overhead.md --json overhead.json
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import itertools
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from strict_gate.engines.base import Engine, PromptInput
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.records import Sampling

REPO = Path(__file__).resolve().parent.parent


class Sections:
    """Wall time per named section of the gate arm, summed over one timed pass."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    def wrap(self, owner, name: str, label: str) -> None:
        """Replace owner.name (a function or method) with a timed copy."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if not self.on:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0

        setattr(owner, name, timed)


def build_engine(kind: str, model: str, dtype: str, device: str, threads: int | None) -> Engine:
    """The engine the gate would build for this arm (the shipped gates' vLLM settings)."""
    if kind == "hf":
        from strict_gate.engines.hf import HFEngine, HFOptions

        return HFEngine(HFOptions(model=model, dtype=dtype, device=device, threads=threads), base_dir=REPO)
    from strict_gate.engines.vllm.engine import VLLMEngine, VLLMOptions

    return VLLMEngine(
        VLLMOptions(model=model, dtype=dtype, enforce_eager=True, kv_cache_memory_bytes=64 << 20,
                    max_model_len=512, seed=0),
        base_dir=REPO,
    )


def bare_hf(engine: Engine, inputs: list[PromptInput], sampling: Sampling, logits: bool = True) -> int:
    """transformers' own generate on the loaded model, top-k from the raw logits; tokens made."""
    import torch

    model = engine._model  # the very object the gate generates with
    tok = engine._tokenizer()
    eos = sorted(engine._eos_ids())
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    made = 0
    with torch.inference_mode():
        for p in inputs:
            ids = torch.tensor([list(p.token_ids)], device=model.device)
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=sampling.max_tokens, eos_token_id=eos, pad_token_id=pad,
                output_logits=logits, return_dict_in_generate=True,
            )
            if logits:
                lps = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
                top = torch.topk(lps, sampling.top_logprobs, dim=-1)
                top.indices.tolist(), top.values.tolist()
            made += len(out.sequences[0, ids.shape[1]:].tolist())
    return made


def bare_vllm(engine: Engine, inputs: list[PromptInput], sampling: Sampling) -> int:
    """vLLM's own generate on the loaded LLM, one prompt per call; tokens made."""
    from vllm import SamplingParams

    llm = engine._llm  # the very object the gate generates with
    params = SamplingParams(temperature=0.0, max_tokens=sampling.max_tokens, logprobs=sampling.top_logprobs)
    made = 0
    for p in inputs:
        out = llm.generate([{"prompt_token_ids": list(p.token_ids)}], params, use_tqdm=False)
        made += len(out[0].outputs[0].token_ids)
    return made


def instrument(engine: Engine, sections: Sections) -> None:
    """Time the gate arm's parts: the library's generate, audit, writing, the manifest, reading back."""
    import strict_gate.gate.arm as runner
    import strict_gate.runs.writer as writer

    if engine.kind == "hf":
        sections.wrap(engine._model, "generate", "library generate")
    else:
        sections.wrap(engine._llm, "generate", "library generate")
    # sort_topk as the engine's records are built: hf imports it into its own module, vLLM into
    # its outputs module (records are built there since the engine was split)
    where = type(engine).__module__ if hasattr(sys.modules[type(engine).__module__], "sort_topk") \
        else "strict_gate.engines.vllm.outputs"
    sections.wrap(__import__(where, fromlist=["sort_topk"]), "sort_topk", "sort_topk (record building)")
    sections.wrap(runner, "audit_record", "audit")
    sections.wrap(writer.RunWriter, "add", "write records.jsonl")
    sections.wrap(writer.RunWriter, "finish", "write records.jsonl")
    sections.wrap(engine, "info", "engine.info (manifest)")
    sections.wrap(runner, "load_run", "read run back")


def gate_arm(engine: Engine, inputs: list[PromptInput], sampling: Sampling, ps: PromptSet, out: Path):
    """The gate's path for one arm: runner.run_arm into a fresh run directory."""
    from strict_gate.gate.arm import run_arm

    return run_arm(engine, inputs, sampling, out, prompt_set=ps)


def per_gate_costs(run, other, ps: PromptSet, ids: list[str], sampling: Sampling, work: Path) -> dict[str, float]:
    """Comparing two runs and writing every report: once per gate, whatever the prompt count."""
    from strict_gate.gate.judgement import judge
    from strict_gate.judge.spec import GateSpec, PromptSetRef
    from strict_gate.report import write_reports

    spec = GateSpec("overhead", PromptSetRef.stored({"name": ps.name, "sha256": ps.sha256, "count": len(ps)}, ids),
                    sampling, policy="auto", band=0.5)
    t0 = time.perf_counter()
    result = judge(spec, other, run)
    t1 = time.perf_counter()
    write_reports(result, work / "report")
    return {"compare": t1 - t0, "reports": time.perf_counter() - t1}


def profile_top(fn: Callable[[], object], lines: int) -> str:
    """cProfile of one call, the top functions by cumulative time."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(lines)
    return buf.getvalue()


def measure(kind: str, args, ps: PromptSet, work: Path) -> list[dict]:
    """Every max_tokens for one engine: interleaved bare/gate passes, sections, per-gate costs."""
    from strict_gate.gate.arm import prompt_inputs

    engine = build_engine(kind, args.model, args.dtype, args.device, args.threads)
    t0 = time.perf_counter()
    engine.start()
    start_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    inputs = prompt_inputs(ps, engine)[: args.limit or None]
    tokenise = time.perf_counter() - t0
    sections = Sections()
    instrument(engine, sections)
    bare = functools.partial(bare_hf if kind == "hf" else bare_vllm, engine, inputs)
    counter = itertools.count()
    rows = []
    for t in args.max_tokens:
        sampling = Sampling(t, args.top_logprobs)
        gate = functools.partial(lambda s, n: gate_arm(engine, inputs, s, ps, work / f"run-{next(n)}"),
                                 sampling, counter)
        t1 = time.perf_counter()
        gate()  # warm-up, gate first: a cold first call (no warm-up in engine.start) shows here
        first_gate = time.perf_counter() - t1
        bare(sampling)
        times: dict[str, list[float]] = {"bare": [], "gate": [], "bare (tokens only)": []}
        per_section: list[dict[str, float]] = []
        made = 0
        for rep in range(args.reps):
            order = ["bare", "gate"] if rep % 2 == 0 else ["gate", "bare"]
            if kind == "hf":
                order.append("bare (tokens only)")
            for mode in order:
                t1 = time.perf_counter()
                if mode == "gate":
                    sections.seconds.clear()
                    sections.on = True
                    run = gate()
                    sections.on = False
                    per_section.append(dict(sections.seconds))
                elif mode == "bare":
                    made = bare(sampling)
                else:
                    bare_hf(engine, inputs, sampling, logits=False)
                times[mode].append(time.perf_counter() - t1)
        gate_tokens = sum(len(r.token_ids) for r in run.records.values())
        if gate_tokens != made:
            raise SystemExit(f"{kind} T={t}: the gate made {gate_tokens} tokens, bare {made}: not the same work")
        fixed = per_gate_costs(run, args.reference_runs.get(t, run), ps, [p.id for p in inputs], sampling,
                               work / f"judge-{kind}-{t}")
        med = {m: statistics.median(v) for m, v in times.items() if v}
        sec = {k: statistics.median(s.get(k, 0.0) for s in per_section) for k in {k for s in per_section for k in s}}
        sec["extraction, record building, other"] = med["gate"] - sum(sec.values())
        row = {
            "engine": kind, "max_tokens": t, "prompts": len(inputs), "tokens": made, "reps": args.reps,
            "times": times, "median": med, "first_gate_pass": first_gate, "start_s": start_s, "sections": sec,
            "tokenise": tokenise, **fixed,
            "ratio": med["gate"] / med["bare"],
            "ratio_whole": (tokenise + med["gate"] + fixed["compare"] + fixed["reports"]) / (tokenise + med["bare"]),
        }
        if args.profile:
            row["profile"] = profile_top(gate, 30)
        rows.append(row)
        args.reference_runs.setdefault(t, run)  # the first engine's run is the next one's reference
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
    engine.close()
    return rows


def machine() -> str:
    """What the figures were measured on (the speed arm's own description, plus the stack)."""
    import torch

    from strict_gate.speed.bench import machine as cpu_and_gpus

    dev = "" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu_and_gpus()}{dev}, Python {platform.python_version()}, torch {torch.__version__}"


def load_average(start: tuple[float, ...]) -> str:
    """The machine is shared: the load average when the run started and when it ended."""
    fmt = lambda la: " ".join(f"{x:.2f}" for x in la)  # noqa: E731
    return f"load average {fmt(start)} at the start, {fmt(os.getloadavg())} at the end"


def markdown(rows: list[dict], command: str, load_start: tuple[float, ...]) -> str:
    """The table: tok/s both ways, the ratio, then where the gate arm's time went."""
    out = [f"`{command}`", "", f"Machine: {machine()}; {load_average(load_start)}.", "",
           "| engine | max_tokens | prompts | tokens | bare s | gate s | bare tok/s | gate tok/s | gate/bare "
           "| tokens-only bare s | + tokenise, compare, reports: gate/bare |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median"]
        plain = f"{m['bare (tokens only)']:.2f}" if "bare (tokens only)" in m else "-"
        out.append(
            f"| {r['engine']} | {r['max_tokens']} | {r['prompts']} | {r['tokens']} | {m['bare']:.2f} | {m['gate']:.2f} "
            f"| {r['tokens'] / m['bare']:.0f} | {r['tokens'] / m['gate']:.0f} | **{r['ratio']:.3f}** | {plain} "
            f"| {r['ratio_whole']:.3f} |"
        )
    out += ["", "Where the gate arm's time went (median seconds over the repetitions; per-gate costs once):", "",
            "| engine | max_tokens | section | s | share of gate arm |", "|---|---|---|---|---|"]
    for r in rows:
        g = r["median"]["gate"]
        for name, s in sorted(r["sections"].items(), key=lambda kv: -kv[1]):
            out.append(f"| {r['engine']} | {r['max_tokens']} | {name} | {s:.3f} | {100 * s / g:.1f}% |")
        for name in ("tokenise", "compare", "reports"):
            out.append(f"| {r['engine']} | {r['max_tokens']} | {name} (once per gate) | {r[name]:.3f} | - |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", choices=("hf", "vllm"), default=["vllm", "hf"],
                    help="in this order; each later engine's run is compared against the first one's")
    ap.add_argument("--model", default="bundled:tiny-llama")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu", help="hf only")
    ap.add_argument("--threads", type=int, default=None,
                    help="hf: torch threads for gate and bare alike (1 steadies timings on a shared CPU)")
    ap.add_argument("--prompts", type=Path, default=REPO / "prompts" / "battery-128.jsonl")
    ap.add_argument("--limit", type=int, default=0, help="the first N prompts only (0: all)")
    ap.add_argument("--max-tokens", nargs="+", type=int, default=[16, 128])
    ap.add_argument("--top-logprobs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="one more gate pass under cProfile, in the JSON")
    ap.add_argument("--md", type=Path, help="write the markdown table here (else stdout)")
    ap.add_argument("--json", type=Path, help="write every timing here")
    args = ap.parse_args()
    args.reference_runs = {}
    ps = load_prompts(args.prompts)
    command = "benchmarks/overhead.py " + " ".join(sys.argv[1:])
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="strict-gate-overhead-") as tmp:
        for kind in args.engines:
            rows += measure(kind, args, ps, Path(tmp) / kind)
    table = markdown(rows, command, load_start)
    if args.md:
        args.md.write_text(table)
    print(table)
    if args.json:
        summary = {"command": command, "machine": machine(), "load": load_average(load_start), "rows": rows}
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
