"""`strict-gate battery build` and `score`: the reference over a pool, its margins, the choice.

The reference runs through the ordinary runner (gate/arm.py: every record audited as it is
written) into a run directory kept beside the output, `<name>.run/`. A run that stopped is
continued where it stopped on the next build, and a complete one is reused without loading
the engine, but only when it was made over the same pool and sampling by the same engine kind.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from strict_gate.battery.margins import MarginProfile, calibrate, profile, prompt_flip_probabilities
from strict_gate.battery.pool import Pool
from strict_gate.battery.provenance import (
    SCALES,
    SCHEMA,
    provenance_path,
    random_detection,
    sensitivity,
    write_provenance,
)
from strict_gate.battery.select import Candidate, Coverage, check_feasible, default_coverage, select
from strict_gate.errors import InputError
from strict_gate.gate.arm import OnRecord, prompt_inputs, run_arm
from strict_gate.gate.config import ArmConfig
from strict_gate.runs.layout import RunDir
from strict_gate.runs.output import ensure_writable_dir
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Record, Run, Sampling, now_iso, write_text_atomic

CALIBRATION_TARGET = 0.01  # the selection scale flips one pool prompt in a hundred, on average
Progress = Callable[[str, int], OnRecord]


@dataclass(frozen=True)
class Rule:
    size: int
    band: float
    scale: float | None = None  # None: calibrated on the pool
    min_per_group: int | None = None  # None: default_coverage's
    max_share: float = 0.5
    seed: int = 0

    def coverage(self, groups: int) -> Coverage:
        if self.min_per_group is None:
            return default_coverage(self.size, groups, self.max_share)
        return Coverage(self.min_per_group, self.max_share)


@dataclass(frozen=True)
class Built:
    path: Path
    provenance: Path
    run_dir: Path
    doc: dict


def run_dir_for(out: Path) -> Path:
    return out.with_name(out.stem + ".run")


def _fits(run: Run, ps: PromptSet, sampling: Sampling, arm: ArmConfig) -> None:
    m = run.manifest
    for name, have, want in (("prompt set sha256", m.prompt_set.get("sha256"), ps.sha256),
                             ("max_tokens", m.sampling.max_tokens, sampling.max_tokens),
                             ("top_logprobs", m.sampling.top_logprobs, sampling.top_logprobs),
                             ("engine kind", m.engine.kind, arm.kind)):
        if have != want:
            raise InputError(f"holds a reference run whose {name} is {have!r}, not {want!r}: it is not this "
                             "build's; remove it or write the battery elsewhere", path=run.path)


def reference_records(arm: ArmConfig, ps: PromptSet, sampling: Sampling, run_dir: Path,
                      progress: Progress | None = None) -> Run:
    """The reference's run over `ps` in run_dir: reused when complete, continued when it stopped."""
    stored = None
    if RunDir(run_dir).manifest.exists():
        stored = load_run(run_dir, allow_incomplete=True)
        _fits(stored, ps, sampling, arm)
        if stored.manifest.status == "complete":
            return stored
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise InputError("exists, is not empty and is not a run directory; refusing to write into it", path=str(run_dir))
    ensure_writable_dir(run_dir.parent, "output's directory")
    engine = arm.build()
    try:
        inputs = prompt_inputs(ps, engine)
        todo = len(inputs) - (len(stored.records) if stored else 0)
        hook = progress(arm.kind, todo) if progress else None
        return run_arm(engine, inputs, sampling, run_dir, prompt_set=ps, on_record=hook, resume_from=stored)
    finally:
        engine.close()


def profiles_of(ps: PromptSet, records: Mapping[str, Record]) -> tuple[list[MarginProfile], list[dict]]:
    """Margin profiles in the set's order; prompts the reference errored on are left out (listed),
    and so is every copy of a prompt seen before (the same token ids): a copy flips exactly when
    its original does, so counting it as an independent prompt would inflate the detection."""
    out, excluded = [], []
    first: dict[tuple[int, ...], str] = {}
    for pid in ps.ids:
        rec = records.get(pid)
        if rec is None:
            raise InputError(f"the reference run has no record of prompt {pid!r}")
        if rec.error is not None:
            excluded.append({"id": pid, "error": rec.error})
            continue
        if (seen := first.setdefault(tuple(rec.prompt_token_ids), pid)) != pid:
            excluded.append({"id": pid, "error": f"a copy of prompt {seen!r} (the same token ids): counted once"})
            continue
        out.append(profile(rec))
    return out, excluded


def _reference_json(run: Run) -> dict:
    e = run.manifest.engine
    return {"kind": e.kind, "model": e.model, "versions": e.versions, "options": e.options, "run": str(run.path)}


def _scales(sigma: float) -> list[float]:
    return sorted({*SCALES, sigma})


def build(pool: Pool, arm: ArmConfig, sampling: Sampling, rule: Rule, out: Path,
          progress: Progress | None = None) -> Built:
    """Run the reference over the pool, choose rule.size prompts, write the set and its provenance."""
    if out.suffix != ".jsonl":
        raise InputError("--out must name a .jsonl file (the battery is a prompt set)", path=str(out))
    if len(pool.prompts) < rule.size:
        raise InputError(f"the pool holds {len(pool.prompts)} prompts, fewer than --size {rule.size}",
                         path=pool.sources[0].path)
    sizes = Counter(pool.groups.values())
    check_feasible(sizes, rule.size, rule.coverage(len(sizes)))  # before minutes of generation
    if rule.scale is not None:
        prompt_flip_probabilities([], rule.scale)  # a bad --scale is refused now, not after the run
    run = reference_records(arm, pool.prompts, sampling, run_dir_for(out), progress)
    profiles, excluded = profiles_of(pool.prompts, run.records)
    if len(profiles) < rule.size:
        raise InputError(f"the pool holds {len(profiles)} distinct prompts the reference answered ({len(excluded)} "
                         f"left out: errors or copies of another), fewer than --size {rule.size}",
                         path=pool.sources[0].path)
    sigma = rule.scale if rule.scale is not None else calibrate(profiles, CALIBRATION_TARGET)
    groups = sorted({pool.groups[p.id] for p in profiles})
    coverage = rule.coverage(len(groups))
    p_sel = prompt_flip_probabilities(profiles, sigma)
    cands = [Candidate(p.id, pool.groups[p.id], float(q), p.smallest) for p, q in zip(profiles, p_sel)]
    chosen = select(cands, rule.size, coverage, rule.seed)
    by_id = {p.id: p for p in pool.prompts.prompts}
    prof_by_id = {p.id: p for p in profiles}
    chosen_profiles = [prof_by_id[c.id] for c in chosen]
    scales = _scales(sigma)
    sens = sensitivity(chosen_profiles, pool.groups, rule.band, scales)
    whole = sensitivity(profiles, pool.groups, rule.band, scales)
    text = "".join(_line(by_id[c.id]) for c in chosen)
    write_text_atomic(out, text)
    ps = load_prompts(out)
    doc = {
        "schema": SCHEMA,
        "created": now_iso(),
        "prompt_set": {"name": ps.name, "sha256": ps.sha256, "count": len(ps)},
        "pool": {
            "files": [s.to_json() for s in pool.sources],
            "split": pool.split.to_json() if pool.split else None,
            "sha256": pool.prompts.sha256,
            "count": len(pool.prompts),
            "excluded": excluded,
            "groups": {g: sum(1 for p in profiles if pool.groups[p.id] == g) for g in groups},
            "histogram": list(whole.histogram),
            "random_detection": random_detection(profiles, rule.size, scales, rule.seed),
        },
        "reference": _reference_json(run),
        "sampling": {"max_tokens": sampling.max_tokens, "top_logprobs": sampling.top_logprobs},
        "rule": {
            "name": "expected-flip@1",
            "model": "logits + N(0, sigma^2) each; P(step flips) = 1 - prod_j (1 - erfc(gap_j / 2 sigma) / 2) over "
                     "the reference's top-K alternatives; P(prompt) = 1 - prod over its steps; battery "
                     "1 - prod over prompts; steps and prompts independent",
            "sigma": sigma,
            "sigma_from": "given (--scale)" if rule.scale is not None
            else f"calibrated: pool mean P(prompt flips) = {CALIBRATION_TARGET:g}",
            "coverage": coverage.to_json(),
            "seed": rule.seed,
            "size": rule.size,
            "band": rule.band,
        },
        "sensitivity": sens.to_json(),
    }
    prov = provenance_path(out)
    write_provenance(prov, doc)
    return Built(out, prov, Path(run.path), doc)


def _line(p) -> str:
    obj: dict = {"id": p.id}
    if p.text is not None:
        obj["text"] = p.text
    else:
        obj["token_ids"] = list(p.token_ids)
    obj["tags"] = list(p.tags)
    return json.dumps(obj, ensure_ascii=False) + "\n"


def stored_run(path: Path, ps: PromptSet) -> Run:
    """A complete stored reference run (a baseline) over exactly this prompt set."""
    run = load_run(path)
    if run.manifest.prompt_set.get("sha256") != ps.sha256:
        raise InputError(f"this run was made over prompt set sha256 {run.manifest.prompt_set.get('sha256')}, "
                         f"not {ps.path} ({ps.sha256})", path=str(path))
    return run


def live_run(arm: ArmConfig, ps: PromptSet, sampling: Sampling, run_out: Path | None,
             progress: Progress | None = None) -> Run:
    """The reference over `ps`, into run_out (kept, continued when it stopped) or a scratch directory."""
    if run_out is not None:
        return reference_records(arm, ps, sampling, run_out, progress)
    with tempfile.TemporaryDirectory(prefix="strict-gate-score-") as tmp:
        run = reference_records(arm, ps, sampling, Path(tmp) / "run", progress)
        return Run(run.path, run.manifest, dict(run.records))  # records are in memory: the directory may go


def score(ps: PromptSet, run: Run, band: float, extra_scales: Sequence[float] = ()) -> dict:
    """The same figures for any prompt set, from a reference run over it (live or stored)."""
    profiles, excluded = profiles_of(ps, run.records)
    groups = {p.id: (p.tags[0] if p.tags else "") for p in ps.prompts}
    sens = sensitivity(profiles, groups, band, sorted({*SCALES, *extra_scales}))
    return {
        "prompt_set": {"name": ps.name, "sha256": ps.sha256, "count": len(ps)},
        "reference": _reference_json(run),
        "sampling": {"max_tokens": run.manifest.sampling.max_tokens, "top_logprobs": run.manifest.sampling.top_logprobs},
        "excluded": excluded,
        "sensitivity": sens.to_json(),
    }
