"""A gate's reference as a noise profile sees it, and the gate's `[noise]` setting.

`arm_facts` is what both `strict-gate noise` (writing a profile) and a gate (reading one)
measure of the reference arm: its dtype, its model and the digest of the model's files, and
for a recorded reference the baseline's records. The same function on both sides, so a
profile fits exactly when it describes this reference. Nothing here loads a model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strict_gate.core.features import TableContext
from strict_gate.core.files import file_sha256
from strict_gate.core.model_files import model_digest, model_digests, resolve_model
from strict_gate.errors import ConfigError, InputError
from strict_gate.judge.compare import MEASURED
from strict_gate.noise.band import ArmFacts, MeasuredBand, NoiseKeys, fit_problems, measured_band
from strict_gate.noise.flips import sample_flip_problems
from strict_gate.noise.profile import PROFILE_NAME, NoiseProfile, load_profile
from strict_gate.runs.layout import RunDir
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.reader import load_run, read_manifest


def shown(path: Path) -> str:
    """A path as a profile stores it: relative to the working directory when inside it (a
    committed profile names no machine's directories), else normalised."""
    p = Path(os.path.normpath(path.resolve()))
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.as_posix()


def baseline_dir(arm: Any) -> Path | None:
    """A recorded arm's baseline directory; None for a live arm."""
    if not arm.engine_type.replays_run:
        return None
    p = Path(arm.options.path)
    return p if p.is_absolute() else Path(arm.base_dir) / p


def arm_facts(arm: Any) -> ArmFacts:
    """An ArmConfig's dtype, model and model digest; a recorded arm's from its baseline's manifest."""
    base = baseline_dir(arm)
    if base is not None:
        return baseline_facts(base, getattr(arm.options, "model", None), Path(arm.base_dir))
    model, dtype = getattr(arm.options, "model", None), getattr(arm.options, "dtype", None)
    return ArmFacts(dtype=dtype if isinstance(dtype, str) else None, model=model if isinstance(model, str) else None,
                    model_digest=_digest(model, Path(arm.base_dir)), engine=arm.kind,
                    model_digests=_digests(model, Path(arm.base_dir)))


def baseline_facts(base: Path, model: str | None, base_dir: Path) -> ArmFacts:
    """A stored run's dtype, engine and records' sha256 from its manifest; its model (`model`, else
    the manifest's) digested where it resolves on this machine."""
    manifest = read_manifest(base)
    dtype = manifest.engine.options.get("dtype")
    model = model or manifest.engine.model
    return ArmFacts(dtype=dtype if isinstance(dtype, str) else None, model=model if isinstance(model, str) else None,
                    model_digest=_digest(model, base_dir), baseline=str(base),
                    baseline_sha256=file_sha256(RunDir(base).records), engine=manifest.engine.kind,
                    model_digests=_digests(model, base_dir))


def _digest(model: object, base_dir: Path) -> str | None:
    if not isinstance(model, str):
        return None
    try:
        return model_digest(resolve_model(model, base_dir))
    except ConfigError:
        return None


def _digests(model: object, base_dir: Path) -> frozenset[str]:
    """Every form a profile may have recorded the model's digest in (an older whole-files one)."""
    if not isinstance(model, str):
        return frozenset()
    try:
        return model_digests(resolve_model(model, base_dir))
    except ConfigError:
        return frozenset()


@dataclass(frozen=True)
class NoiseSetting:
    """The profile a gate reads, and the measured band when the gate asked for one."""

    path: str
    profile: NoiseProfile
    measured: MeasuredBand | None

    def measured_value(self) -> float | None:
        """The gate's band when it asked for the measured one (core/features.py's BandSource)."""
        return self.measured.value if self.measured is not None else None


def noise_setting(band: float | str, table: dict | None, reference: Any, prompts: Path, *, path: str,
                  line_of, max_tokens: int | None = None) -> NoiseSetting | None:
    """None when the gate neither has [noise] nor asks for a measured band; else the profile,
    checked to fit the reference, the battery and the gate's max_tokens, and for a recorded
    reference its K-run flips re-derived from the baseline (exit 2 naming the profile and the
    field when it does not)."""
    if table is None and band != MEASURED:
        return None
    from strict_gate.core.options import parse_options

    keys = parse_options(NoiseKeys, table or {}, where="noise", line_of=line_of)
    profile_path = _profile_path(keys, reference, path)
    try:
        profile = load_profile(profile_path)
    except InputError as e:
        raise ConfigError(f"[noise] {e}", path=path, line=line_of("profile") or line_of("band")) from None
    problems = fit_problems(profile, arm_facts(reference), load_prompts(prompts).sha256, max_tokens)
    base = baseline_dir(reference)
    if not problems and base is not None:
        problems = sample_flip_problems(profile, load_run(base).records)
    if problems:
        raise ConfigError(f"the noise profile {profile_path} does not fit this gate: {'; '.join(problems)}",
                          path=path, line=line_of("profile") or line_of("band"))
    measured = measured_band(profile, keys, path) if band == MEASURED else None
    return NoiseSetting(shown(profile_path), profile, measured)


def _profile_path(keys: NoiseKeys, reference: Any, path: str) -> Path:
    if keys.profile is not None:
        p = Path(keys.profile)
        return p if p.is_absolute() else Path(reference.base_dir) / p
    base = baseline_dir(reference)
    if base is None:
        raise ConfigError('band = "measured" (or [noise]) with a live reference: name its profile in [noise] '
                          "profile = \"...\" (a recorded reference's defaults to noise.json in its baseline)",
                          path=path)
    return base / PROFILE_NAME


def with_noise(result, setting: NoiseSetting | None):
    """The GateResult with its candidate flips placed against the reference's noise (a gate with
    a profile); the result as it is otherwise."""
    if setting is None:
        return result
    from dataclasses import replace

    from strict_gate.judge.result import with_feature
    from strict_gate.noise.annotate import judge_noise

    sha = result.prompt_set.get("sha256")
    if sha != setting.profile.provenance.battery.sha256:  # the config's prompts were replaced after it was read
        return replace(result, notes=(*result.notes, f"the noise profile {setting.path} was measured on another "
                                      "battery than this gate ran: its flips are not placed against it"))
    dtypes = {arm: info.options.get("dtype") or (info.options.get("hello") or {}).get("dtype")  # a command engine's hello
              for arm, info in (("reference", result.reference), ("candidate", result.candidate))}
    m = setting.measured
    used = m is not None and result.verdict.band == m.value
    note = judge_noise(setting.profile, setting.path, result.comparison, band=result.verdict.band,
                       band_rule=m.rule if used and m is not None else None, dtypes=dtypes)
    if m is not None and not used:  # --band on the command line: that band judged, and the report says so
        note = replace(note, notes=(*note.notes, f"band = \"measured\" would be {m.value:.4g} ({m.rule}); the band "
                                    f"given on the command line, {result.verdict.band:g}, judged instead"))
    return with_feature(result, "noise", note)


def stored_noise(profile_path: Path, reference: Path, *, measured: bool, floor: float = 0.0,
                 ulps: float = 0.0) -> NoiseSetting:
    """`strict-gate compare --noise PROFILE`: the profile checked against the stored reference
    run as a gate checks it against a recorded reference (its battery, model digest, dtype,
    engine, records and max_tokens; its K-run flips re-derived from the run), then its measured
    band when asked for. Bad input (exit 2) names the profile and the field."""
    from strict_gate.core.options import parse_options

    where = str(profile_path)
    keys = parse_options(NoiseKeys, {"floor": floor, "ulps": ulps}, where="compare --noise-floor/--noise-ulps",
                         line_of=lambda _k: None)
    profile = load_profile(profile_path)
    manifest = read_manifest(reference)
    battery = manifest.prompt_set.get("sha256")
    problems = fit_problems(profile, baseline_facts(reference, None, Path(".")), battery if isinstance(battery, str)
                            else "", manifest.sampling.max_tokens)
    if not problems:
        problems = sample_flip_problems(profile, load_run(reference, allow_incomplete=True).records)
    if problems:
        raise InputError(f"the noise profile does not fit the reference run {reference}: {'; '.join(problems)}",
                         path=where)
    return NoiseSetting(shown(profile_path), profile, measured_band(profile, keys, where) if measured else None)


def from_gate(ctx: TableContext) -> NoiseSetting | None:
    """The gate config's `[noise]` and band = "measured" (core/features.py's registry calls it)."""
    noise = ctx.data.get("noise")
    return noise_setting(ctx.band, noise if isinstance(noise, dict) else None, ctx.arms["reference"], ctx.prompts,
                         path=ctx.path, line_of=_line_of(ctx), max_tokens=ctx.max_tokens)


def _line_of(ctx: TableContext):
    """A key's line in [noise] (else the top level's `band`), carrying the file as `line_of.path`:
    parse_options names the file only through it, so a wrong-typed key names file and line."""

    def line_of(key: str) -> int | None:
        return ctx.lines.find(key, "noise") or ctx.lines.find(key)

    line_of.path = ctx.path  # type: ignore[attr-defined]
    return line_of


def of(cfg: Any) -> NoiseSetting | None:
    """A gate config's noise setting (gate/config.py's GateConfig.features)."""
    s = cfg.feature("noise")
    return s if isinstance(s, NoiseSetting) else None
