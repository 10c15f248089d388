"""`strict-gate noise CONFIG`: the reference's own noise, into a profile beside its baseline.

CONFIG is a capture config or a gate: its [reference] is profiled. A recorded reference's K
runs come from its baseline (checked: really K, really runs), and its live variations from
the [rescorer] (the same build, checked); a live reference's K runs from its baseline
(`--baseline`, default baselines/<name> when captured there) or, without one, K live runs.
Every live run is an audited run directory under <output_dir>/<name>-noise-<time>/; the
profile goes to noise.json in the baseline (or --out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.files import file_sha256
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.arm import OnRecord, prompt_inputs, run_arm
from strict_gate.gate.config import ArmConfig, GateConfig, load_gate_config
from strict_gate.noise.flips import exact_ties
from strict_gate.noise.kruns import check_k_runs
from strict_gate.noise.measure import Measured, NoisePlan, k_runs, live_variations, prefill_decode, second_builds
from strict_gate.noise.profile import NOISE_SCHEMA, PROFILE_NAME, Battery, NoiseProfile, Provenance, write_profile
from strict_gate.noise.setting import arm_facts, baseline_dir, shown
from strict_gate.runs.layout import RunDir
from strict_gate.runs.output import ensure_writable_dir, safe_name
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, Sampling, now_iso

DEFAULT_K = 5


@dataclass(frozen=True)
class NoiseOutcome:
    profile: NoiseProfile
    path: Path
    report_dir: Path


class _Runner:
    """The gate's runner over one prompt set, with progress."""

    def __init__(self, ps: PromptSet, sampling: Sampling, progress):
        self.ps, self.sampling, self.progress = ps, sampling, progress

    def __call__(self, engine: Engine, prompts: Sequence[PromptInput], out: Path, label: str, runs: int = 1) -> Run:
        on_record: OnRecord | None = self.progress(label, len(prompts)) if self.progress else None
        return run_arm(engine, prompts, self.sampling, out, prompt_set=self.ps, runs=runs, on_record=on_record)

    def kept(self, out: Path) -> Run | None:
        """`strict-gate noise` has no resume: every run is made afresh in its own directory."""
        return None

    def run(self, engine: Engine, prompts: Sequence[PromptInput], out: Path, label: str, *,
            continues: bool = True) -> Run:
        """The invariance runner's call (invariance/run.py's Runner): nothing to continue here."""
        return self(engine, prompts, out, label)


def _live_arm(cfg: GateConfig) -> ArmConfig | None:
    """The live engine of the reference's build: the reference, or a recorded one's [rescorer]
    (the same dtype and model files, else its variations would measure another build)."""
    if cfg.reference.engine_type.measurable:
        return cfg.reference
    if cfg.rescorer is None:
        return None
    ref, live = arm_facts(cfg.reference), arm_facts(cfg.rescorer)
    if (ref.dtype, ref.model_digest) != (live.dtype, live.model_digest):
        raise ConfigError(f"the [rescorer] ({live.dtype}, {live.model}) is not the reference's build ({ref.dtype}, "
                          f"{ref.model}): its variations would measure another engine", path=cfg.path)
    return cfg.rescorer


def _baseline(cfg: GateConfig, given: Path | None) -> Path | None:
    recorded = baseline_dir(cfg.reference)
    if recorded is not None:
        return recorded
    if given is not None:
        return given
    default = Path("baselines") / safe_name(cfg.name)
    return default if (default / "manifest.json").exists() else None


def _check_battery(run: Run, ps: PromptSet, sampling: Sampling) -> None:
    m = run.manifest
    if m.prompt_set.get("sha256") != ps.sha256 or m.sampling.max_tokens != sampling.max_tokens:
        raise InputError(f"this run was made on another battery or max_tokens (sha256 {m.prompt_set.get('sha256')}, "
                         f"max_tokens {m.sampling.max_tokens}) than the config's ({ps.sha256}, {sampling.max_tokens})",
                         path=run.path)


def _second_build(spec: str, ps: PromptSet, inputs: Sequence[PromptInput], runner: _Runner,
                  out: Path) -> tuple[str, Run]:
    """`--against`: a run directory, or CONFIG[:arm] (default arm: reference) run at batch 1."""
    path, _, arm = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    if (Path(path) / "manifest.json").exists():
        return Path(path).name, load_run(path)
    other = load_gate_config(Path(path), require_candidate=False)
    armcfg = {"reference": other.reference, "candidate": other.candidate}.get(arm or "reference")
    if armcfg is None:
        raise ConfigError(f"--against {spec}: no [{arm}] arm", path=path)
    name = f"{other.name}:{arm or 'reference'}"
    base = baseline_dir(armcfg)
    if base is not None:
        return name, load_run(base)
    engine = armcfg.build()
    try:
        return name, runner(engine, inputs, out / safe_name(f"build-{name}"), f"build {name}")
    finally:
        engine.close()


def measure_noise(cfg: GateConfig, *, plan_batch: Sequence[int] = (8,), chunks: Sequence[int] = (),
                  prefill: bool = True, against: Sequence[str] = (), baseline: Path | None = None,
                  runs: int | None = None, out: Path | None = None, output_dir: Path | None = None,
                  progress=None) -> NoiseOutcome:
    from strict_gate.gate.outcome import new_report_dir

    ps = load_prompts(cfg.prompts)
    sampling = Sampling(cfg.max_tokens, cfg.top_logprobs)
    runner = _Runner(ps, sampling, progress)
    live = _live_arm(cfg)
    base_path = _baseline(cfg, baseline)
    facts = arm_facts(cfg.reference)
    if facts.dtype is None or facts.model is None:
        raise ConfigError("the [reference] states no dtype or model: a profile must say which build it measured",
                          path=cfg.path)
    ensure_writable_dir(output_dir or cfg.output_dir)
    report_dir = new_report_dir(output_dir or cfg.output_dir, f"{cfg.name}-noise")
    tokenizer = cfg.reference.build()
    with engine_log(report_dir / "tokenizer.log", tokenizer.log_libraries):
        inputs = prompt_inputs(ps, tokenizer)
    tokenizer.close()
    m = Measured(facts.dtype)
    if base_path is not None:
        golden = load_run(base_path)
        _check_battery(golden, ps, sampling)
        k, notes = check_k_runs(golden, expected=cfg.reference.runs if cfg.reference.runs > 1 else None)
        m.notes += notes
        k_runs(m, golden, k, f"the baseline {shown(base_path)}")
    elif live is not None:
        k = runs or (cfg.reference.runs if cfg.reference.runs > 1 else DEFAULT_K)
        engine = live.build()
        try:
            golden = runner(engine, inputs, report_dir / f"runs-{k}", f"reference x{k}", runs=k)
        finally:
            engine.close()
        k, notes = check_k_runs(golden)
        m.notes += notes
        k_runs(m, golden, k, "live, this command")
    else:
        raise ConfigError("nothing to measure: the reference is a stored run with no [rescorer] and no baseline",
                          path=cfg.path)
    base = golden
    if live is not None:
        plan = NoisePlan(batch=tuple(plan_batch), chunked_prefill=tuple(chunks), prefill_decode=prefill)
        base = live_variations(m, plan, live.build, inputs, report_dir / "invariance", runner, golden
                               if base_path is not None else None) or golden
        if prefill:
            prefill_decode(m, live.build, base, cfg.top_logprobs, report_dir / "prefill-decode.log")
    else:
        m.notes.append("no live engine of the reference's build: only its K runs were measured")
    builds = dict(_second_build(s, ps, inputs, runner, report_dir) for s in against)
    for run in builds.values():
        _check_battery(run, ps, sampling)
    second_builds(m, golden, builds)
    profile = NoiseProfile(
        schema=NOISE_SCHEMA,
        provenance=Provenance(
            battery=Battery(name=ps.name, sha256=ps.sha256, count=len(ps)), model=facts.model,
            model_digest=facts.model_digest, dtype=facts.dtype, engine=base.manifest.engine.kind,
            versions={k: str(v) for k, v in base.manifest.engine.versions.items()}, k=k,
            baseline=None if base_path is None else shown(base_path), baseline_sha256=facts.baseline_sha256 or (
                None if base_path is None else _records_sha(base_path)),
            max_tokens=cfg.max_tokens, top_logprobs=cfg.top_logprobs, created=now_iso(), notes=m.notes),
        variations=m.variations, self_flips=m.flips, largest_self_flip_gap=None, largest_magnitude=None,
        exact_ties=exact_ties(golden.records.values()))
    target = out or ((base_path if base_path is not None else Path("baselines") / safe_name(cfg.name)) / PROFILE_NAME)
    written = write_profile(profile, target)
    return NoiseOutcome(written, Path(shown(target)), Path(shown(report_dir)))


def _records_sha(base: Path) -> str:
    return file_sha256(RunDir(base).records)
