"""Hand-built speed results for the report tests: each verdict, a ratio that cannot be told
from 1.0 (nor from its bar: not separable), a flattering mismatch, an arm that could not be
measured."""

from __future__ import annotations

from helpers import rec

from strict_gate.gate.judgement import judge
from strict_gate.judge.result import with_feature
from strict_gate.judge.spec import GateSpec, PromptSetRef
from strict_gate.report import GateResult
from strict_gate.runs.records import EngineInfo, Manifest, Run, Sampling, now_iso
from strict_gate.speed.model import (
    ArmFigures,
    Figure,
    Method,
    Mismatch,
    Rung,
    RungResult,
    SpeedResult,
    TokenCheck,
)
from strict_gate.speed.verdict import judge_speed

RUNGS = (Rung("128/128", 128, 128), Rung("1024/128@4", 1024, 128, concurrency=4))
REF = {"ttft_s": (0.020, 0.0205, 0.021, 0.0215, 0.022), "decode_tok_s": (100.0, 100.5, 101.0, 101.5, 102.0),
       "e2e_tok_s": (90.0, 90.5, 91.0, 91.5, 92.0)}
# candidate figures per case (5 runs: enough for a 95 % interval): decode 0.97x [0.96, 0.98] (above
# the 0.95 bar), 0.81x (below it), and 1.00x [0.93, 1.07] (1.0 inside: not separable, the bar too)
CAND = {
    "fast": {"ttft_s": (0.027, 0.0275, 0.028, 0.0285, 0.029), "decode_tok_s": (97.0, 97.5, 98.0, 98.5, 99.0),
             "e2e_tok_s": (88.0, 88.25, 88.5, 88.75, 89.0)},
    "slow": {"ttft_s": (0.030, 0.0305, 0.031, 0.0315, 0.032), "decode_tok_s": (81.0, 81.5, 82.0, 82.5, 83.0),
             "e2e_tok_s": (75.0, 75.5, 76.0, 76.5, 77.0)},
    "even": {"ttft_s": (0.020, 0.02075, 0.0215, 0.02225, 0.023), "decode_tok_s": (94.0, 97.5, 101.0, 104.5, 108.0),
             "e2e_tok_s": (89.0, 90.0, 91.0, 92.0, 93.0)},
}
FLATTERING = Mismatch("dtype", "bfloat16", "float16", flattering=True, message="the candidate computes in fp16")
CASES = ("pass", "fail", "incomplete", "not-separable", "flattering", "informational")


def arm(figs: dict, self_reported: dict | None = None) -> ArmFigures:
    return ArmFigures(**{k: Figure(tuple(v)) for k, v in figs.items()}, tokens=128, self_reported=self_reported)


def speed(case: str) -> SpeedResult:
    """One SpeedResult per case; the verdict is judged by the model's own judge_speed."""
    cand = {"fail": "slow", "not-separable": "even"}.get(case, "fast")
    rungs = [RungResult(r, arm(REF), arm(CAND[cand], {"vllm:gpu_cache_usage": 0.4} if i == 0 else None),
                        token_check=TokenCheck(checked=6))
             for i, r in enumerate(RUNGS)]
    if case == "incomplete":
        rungs[1] = RungResult(RUNGS[1], arm(REF), None, error="candidate: connection refused")
    bars = {} if case == "informational" else {"decode": 0.95}
    method = Method.TWO_REQUEST if case == "informational" else Method.STREAM
    mismatches = (FLATTERING,) if case == "flattering" else ()
    return SpeedResult(
        method=method, runs=5, warmup=1, rungs=tuple(rungs), mismatches=mismatches,
        verdict=judge_speed(rungs, bars, method=method, mismatches=mismatches), machine="1x NVIDIA H200, 16 cores",
        notes=("gpu clocks not locked",) if case == "pass" else (),
        checked_rungs=tuple(r.rung.name for r in rungs if r.reference and r.candidate),
    )


def gate(speed_result: SpeedResult | None = None, *, diverge: bool = False) -> GateResult:
    """A three-prompt gate against a vLLM reference; one prompt diverges when asked."""
    def run(kind: str, records) -> Run:
        m = Manifest(engine=EngineInfo(kind=kind, model="m"), prompt_set={"sha256": "0" * 64},
                     sampling=Sampling(4, 2), created=now_iso(), status="complete")
        return Run("run", m, {r.id: r for r in records})

    ids = ["a", "b", "c"]
    ref = run("vllm", [rec(i, [5, 6, 7, 8]) for i in ids])
    cand = run("openai", [rec(i, [5, 6, 9, 8] if diverge and i == "b" else [5, 6, 7, 8]) for i in ids])
    spec = GateSpec("speedy", PromptSetRef.stored({"name": "hand", "sha256": "0" * 64}, ids), Sampling(4, 2),
                    policy="strict", band=0.5)
    result = judge(spec, ref, cand)
    return with_feature(result, "speed", speed_result)
