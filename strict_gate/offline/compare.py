"""Two stored runs compared (`strict-gate compare`, no engine, no torch): the judge's verdict on
them, the reference's noise profile placed against the flips (`--noise`), and the reports.

Its own wing above the gate and the feature folders: it runs none of the gate's phases but reads
a feature's settings as a gate would (the noise profile), which gate/ may not import.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.judgement import judge
from strict_gate.judge.compare import DEFAULT_BAND, MEASURED
from strict_gate.judge.compare_runs import compare_on_disk
from strict_gate.judge.devices import device_notes
from strict_gate.judge.policy import DEFAULT_POLICY, Policy, check_policy
from strict_gate.judge.result import GateResult
from strict_gate.judge.spec import GateSpec, PromptSetRef, valid_band
from strict_gate.judge.text_only import run_decoder
from strict_gate.noise.setting import NoiseSetting, stored_noise, with_noise
from strict_gate.runs.audit import check_comparable
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.stream import RunRecords, open_run


def compare_run_dirs(
    reference: str | Path,
    candidate: str | Path,
    *,
    policy: Policy | str = DEFAULT_POLICY,
    band: float | str = DEFAULT_BAND,
    prompts: str | Path | None = None,
    out: str | Path | None = None,
    noise: str | Path | None = None,
    noise_floor: float = 0.0,
    noise_ulps: float = 0.0,
) -> GateResult:
    """Compare two stored run directories (no engine, no torch) and optionally write reports.

    Runs that are not comparable (prompt set, max_tokens, top_logprobs) are bad input (exit 2);
    `prompts` names the prompt set whose ids are expected, so a prompt missing from both runs
    is reported as missing rather than silently absent. `noise` is the reference's noise profile
    (docs/noise.md), checked to fit the reference run as a gate checks it: each flip placed
    against it, and with band = "measured" the band is its rule's (noise_floor, noise_ulps: the
    [noise] table's floor and ulps).

    Both runs are streamed from disk (runs/stream.py): memory stays flat in the number of
    prompts, and the result's records are read back on demand (a report's detailed prompts
    included: none is held whole)."""
    ref_dir, cand_dir = Path(reference), Path(candidate)
    setting = _noise(noise, ref_dir, band, noise_floor, noise_ulps)
    measured = setting.measured if setting is not None else None
    band = valid_band(measured.value if measured is not None else band)  # type: ignore[arg-type]  # not "measured": _noise
    ref = open_run(ref_dir, allow_incomplete=True)
    cand = open_run(cand_dir, allow_incomplete=True)
    check_comparable(ref, cand)
    ps_info = dict(ref.manifest.prompt_set)
    prompt_ids = ref.manifest.prompt_ids or cand.manifest.prompt_ids
    if prompts is not None:
        ps = load_prompts(prompts)
        if ps.sha256 != ps_info.get("sha256"):
            raise InputError(
                f"prompt set sha256 {ps.sha256} differs from the runs' {ps_info.get('sha256')}",
                path=str(prompts),
            )
        prompt_ids = ps.ids
    spec = GateSpec(name=f"{ref_dir.name}-vs-{cand_dir.name}", prompt_set=PromptSetRef.stored(ps_info, prompt_ids),
                    sampling=ref.manifest.sampling, policy=check_policy(policy), band=band)
    assert isinstance(ref.records, RunRecords) and isinstance(cand.records, RunRecords)
    comparison = compare_on_disk(ref.records, cand.records, band=spec.band, prompt_ids=prompt_ids,
                                 greedy_tolerance=spec.greedy_tolerance, decode=run_decoder(cand))
    result = with_noise(judge(spec, ref, cand, comparison=comparison, problems=_unheld(
        ps_info.get("count"), prompt_ids, ref.records.keys() | cand.records.keys())), setting)
    result = replace(result, notes=result.notes + device_notes(result.reference, result.candidate, None, comparison))
    if out is not None:
        from strict_gate.report import write_reports

        write_reports(result, Path(out))
    return result


def _noise(profile: str | Path | None, reference: Path, band: float | str, floor: float,
           ulps: float) -> NoiseSetting | None:
    """The profile --noise names, fitted to the reference run; band "measured" needs one."""
    if profile is None:
        if band == MEASURED:
            raise ConfigError('--band measured takes its band from a noise profile: give --noise PROFILE')
        return None
    if not isinstance(band, str):
        valid_band(band)  # a number, checked before the profile is read
    return stored_noise(Path(profile), reference, measured=band == MEASURED, floor=floor, ulps=ulps)


def _unheld(count: object, prompt_ids: list[str] | None, held: Collection[str]) -> list[str]:
    """Prompts the set declares (by count, when it names no ids) that neither run holds: missing,
    so the comparison is incomplete, never a pass."""
    if prompt_ids is not None or not isinstance(count, int) or count <= len(held):
        return []
    return [f"the prompt set declares {count} prompts and the runs hold {len(held)}: {count - len(held)} missing "
            "from both (the manifests name no ids)"]


__all__ = ["compare_run_dirs"]
