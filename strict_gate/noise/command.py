"""`strict-gate noise CONFIG`: the reference's own noise, into a profile beside its baseline.

CONFIG is a capture config or a gate: its [reference] is profiled. A recorded reference's K
runs come from its baseline (checked: really K, really runs), and its live variations from
the [rescorer] (the same build, checked); a live reference's K runs from its baseline
(`--baseline`, default baselines/<name> when captured there) or, without one, K live runs.
Every live run is an audited run directory under <output_dir>/<name>-noise-<time>/, sealed as
a gate's runs are (gate/kept.py); the profile goes to noise.json in the baseline (or --out).
`--resume REPORT_DIR` continues an interrupted measurement under the gate.toml, gate-state.json
and options it wrote first: every run it finished is kept, an unfinished one continued where its
kind serves prompts one at a time, and the profile is the one it would have written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.files import file_sha256
from strict_gate.core.redact import redact_toml
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.arm import prompt_inputs
from strict_gate.gate.config import ArmConfig, GateConfig, load_copied_config, load_gate_config
from strict_gate.gate.judgement import gate_spec
from strict_gate.gate.kept import Runs
from strict_gate.gate.state import (
    check_command,
    check_config_file,
    check_unchanged,
    read_gate_state,
    report_lock,
    write_gate_state,
)
from strict_gate.noise.flips import exact_ties
from strict_gate.noise.kruns import check_k_runs
from strict_gate.noise.measure import Measured, NoisePlan, k_runs, live_variations, prefill_decode, second_builds
from strict_gate.noise.options import NoiseOptions, read_options, write_options
from strict_gate.noise.profile import NOISE_SCHEMA, PROFILE_NAME, Battery, NoiseProfile, Provenance, write_profile
from strict_gate.noise.setting import arm_facts, baseline_dir, shown
from strict_gate.runs.layout import ReportDir, RunDir
from strict_gate.runs.output import ensure_writable_dir, safe_name
from strict_gate.runs.prompts import PromptSet, load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Run, Sampling, now_iso, write_text_atomic

DEFAULT_K = 5
COMMAND = "noise"  # gate-state.json's `command`: the directory is continued by `noise --resume`


@dataclass(frozen=True)
class NoiseOutcome:
    profile: NoiseProfile
    path: Path
    report_dir: Path


def _made(runs: Runs, build: Callable[[], Engine], inputs: Sequence[PromptInput], out: Path, label: str,
          k: int = 1) -> Run:
    """The run in `out`: kept when an interrupted measurement finished it (no engine built for
    it), else made, sealed, an unfinished one continued from its last sealed record (its prompts
    are served one at a time, each K times in a row)."""
    kept = runs.kept(out)
    if kept is not None:
        return kept
    engine = build()
    try:
        return runs.run(engine, inputs, out, label, runs=k)
    finally:
        engine.close()


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


def _second_build(spec: str, inputs: Sequence[PromptInput], runs: Runs, out: Path) -> tuple[str, Run]:
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
    return name, _made(runs, armcfg.build, inputs, out / safe_name(f"build-{name}"), f"build {name}")


def measure_noise(cfg: GateConfig, opts: NoiseOptions, *, output_dir: Path | None = None,
                  progress=None) -> NoiseOutcome:
    """`strict-gate noise CONFIG`: a fresh report directory holding what `--resume` needs (gate.toml,
    gate-state.json with the runs' seal key, the options), then the measurement into it."""
    from strict_gate.gate.outcome import new_report_dir

    ps = load_prompts(cfg.prompts)
    _check_reference(cfg)
    ensure_writable_dir(output_dir or cfg.output_dir)
    report = ReportDir(new_report_dir(output_dir or cfg.output_dir, f"{cfg.name}-noise"))
    with report_lock(report):
        write_text_atomic(report.gate_toml, redact_toml(Path(cfg.path).read_text(encoding="utf-8")))
        state = write_gate_state(report, cfg, ps, gate_spec(cfg, ps), command=COMMAND)
        opts = _settled(cfg, opts)
        write_options(report.path, opts, state.seal_key)
        return _measure(cfg, opts, Runs(report, state, ps, Sampling(cfg.max_tokens, cfg.top_logprobs), progress))


def resume_noise(report_dir: Path, *, progress=None) -> NoiseOutcome:
    """`strict-gate noise --resume REPORT_DIR`: an interrupted measurement continued under its own
    gate.toml and options, every run it finished kept (its seal checked), an unfinished one
    continued where its kind allows; the profile is written as an uninterrupted one would be."""
    report = ReportDir(Path(report_dir))
    if not report.path.is_dir():
        raise InputError("not a noise report directory", path=str(report.path))
    with report_lock(report):
        state = read_gate_state(report)
        check_command(report, state, COMMAND)
        cfg = load_copied_config(report.gate_toml, started=state.config.path, require_candidate=False,
                                 base_dir=Path(state.config.base_dir))
        ps = load_prompts(cfg.prompts)
        check_unchanged(state, cfg, ps)
        check_config_file(report, state)
        opts = read_options(report.path, state.seal_key)
        return _measure(cfg, opts, Runs(report, state, ps, Sampling(cfg.max_tokens, cfg.top_logprobs), progress))


def _settled(cfg: GateConfig, opts: NoiseOptions) -> NoiseOptions:
    """The options with the baseline and the profile's path chosen now, absolute: a resume from
    another directory, or after baselines/<name> appeared, measures and writes what this one would."""
    base = _baseline(cfg, None if opts.baseline is None else Path(opts.baseline))
    out = opts.out or str((base if base is not None else Path("baselines") / safe_name(cfg.name)) / PROFILE_NAME)
    return replace(opts, baseline=None if base is None else str(base), out=out).anchored()


def _check_reference(cfg: GateConfig) -> None:
    """Refused before a report directory is made: a reference that names no build, or a [rescorer]
    of another build."""
    _live_arm(cfg)
    facts = arm_facts(cfg.reference)
    if facts.dtype is None or facts.model is None:
        raise ConfigError("the [reference] states no dtype or model: a profile must say which build it measured",
                          path=cfg.path)


def _golden(cfg: GateConfig, opts: NoiseOptions, runs: Runs, inputs: Sequence[PromptInput], m: Measured,
            live: ArmConfig | None, base_path: Path | None) -> tuple[Run, int]:
    """The golden run and its K: the baseline's (checked), else K live runs into the report directory."""
    if base_path is not None:
        golden = load_run(base_path)
        _check_battery(golden, runs.ps, runs.sampling)
        k, notes = check_k_runs(golden, expected=cfg.reference.runs if cfg.reference.runs > 1 else None)
        m.notes += notes
        k_runs(m, golden, k, f"the baseline {shown(base_path)}")
        return golden, k
    if live is None:
        raise ConfigError("nothing to measure: the reference is a stored run with no [rescorer] and no baseline",
                          path=cfg.path)
    k = opts.runs or (cfg.reference.runs if cfg.reference.runs > 1 else DEFAULT_K)
    golden = _made(runs, live.build, inputs, runs.report.path / f"runs-{k}", f"reference x{k}", k)
    k, notes = check_k_runs(golden)
    m.notes += notes
    k_runs(m, golden, k, "live, this command")
    return golden, k


def _measure(cfg: GateConfig, opts: NoiseOptions, runs: Runs) -> NoiseOutcome:
    """Every variation asked for, each run made (or kept) through `runs`, into the profile."""
    ps, report_dir = runs.ps, runs.report.path
    live = _live_arm(cfg)
    base_path = _baseline(cfg, None if opts.baseline is None else Path(opts.baseline))
    facts = arm_facts(cfg.reference)
    tokenizer = cfg.reference.build()
    with engine_log(report_dir / "tokenizer.log", tokenizer.log_libraries):
        inputs = prompt_inputs(ps, tokenizer)
    tokenizer.close()
    m = Measured(str(facts.dtype))
    golden, k = _golden(cfg, opts, runs, inputs, m, live, base_path)
    base = golden
    if live is not None:
        plan = NoisePlan(batch=opts.batch, chunked_prefill=opts.chunks, prefill_decode=opts.prefill)
        base = live_variations(m, plan, live.build, inputs, report_dir / "invariance", runs, golden
                               if base_path is not None else None) or golden
        if opts.prefill:
            prefill_decode(m, live.build, base, cfg.top_logprobs, report_dir / "prefill-decode.log")
    else:
        m.notes.append("no live engine of the reference's build: only its K runs were measured")
    builds = dict(_second_build(s, inputs, runs, report_dir) for s in opts.against)
    for run in builds.values():
        _check_battery(run, ps, runs.sampling)
    second_builds(m, golden, builds)
    profile = NoiseProfile(
        schema=NOISE_SCHEMA,
        provenance=Provenance(
            battery=Battery(name=ps.name, sha256=ps.sha256, count=len(ps)), model=str(facts.model),
            model_digest=facts.model_digest, dtype=str(facts.dtype), engine=base.manifest.engine.kind,
            versions={k: str(v) for k, v in base.manifest.engine.versions.items()}, k=k,
            baseline=None if base_path is None else shown(base_path), baseline_sha256=facts.baseline_sha256 or (
                None if base_path is None else _records_sha(base_path)),
            max_tokens=cfg.max_tokens, top_logprobs=cfg.top_logprobs, created=now_iso(), notes=m.notes),
        variations=m.variations, self_flips=m.flips, largest_self_flip_gap=None, largest_magnitude=None,
        exact_ties=exact_ties(golden.records.values()))
    assert opts.out is not None  # settled when the measurement started
    target = Path(opts.out)
    written = write_profile(profile, target)
    return NoiseOutcome(written, Path(shown(target)), Path(shown(report_dir)))


def _records_sha(base: Path) -> str:
    return file_sha256(RunDir(base).records)
