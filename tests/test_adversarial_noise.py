"""Hostile references and profiles: every one refused with exit 2 naming the file, never a band.

A reference that lies about its K runs (a manifest's K the samples do not hold, a determinism
summary its samples contradict, K "runs" replayed from a stored run), a profile edited after
it was measured (a number changed; the seal recomputed over figures its flips contradict),
and a profile of another model, dtype or battery. Run from a user's working directory on the
shipped toy baselines (real captured vLLM runs), edited the way a hand or a tool would.
"""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import section
from noise_fixtures import BF16, FP32, ROOT, cli, gate, layout, plant_self_flip, records, rewrite

from strict_gate.noise.profile import seal_of


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(layout(tmp_path))
    gate(tmp_path, "cap.toml", candidate=None)
    return tmp_path


def _manifest(base):
    return json.loads((base / "manifest.json").read_text())


def test_a_manifest_claiming_more_runs_than_its_samples_hold_is_refused(here):
    base = here / "baselines" / FP32
    recs = records(base)
    recs[3]["samples"] = recs[3]["samples"][:3]  # 3 runs of this prompt, the manifest still says 5
    rewrite(base, recs)
    r = cli("noise", "gates/cap.toml")
    assert r.exit_code == 2, r.output
    assert "K = 5 runs" in r.output and "holds 3" in r.output and not (base / "noise.json").exists()


def test_a_determinism_summary_its_samples_contradict_is_refused(here):
    base = here / "baselines" / FP32
    recs = records(base)
    rec = recs[0]
    rec["samples"][2] = rec["token_ids"][:1] + [rec["top_logprobs"][1][1][0]]  # a run that split ...
    rewrite(base, recs)  # ... while the manifest still says all 128 prompts were deterministic
    r = cli("noise", "gates/cap.toml")
    assert r.exit_code == 2 and "disagrees with its samples" in r.output


def test_k_runs_replayed_from_a_stored_run_are_refused(here):
    base = here / "baselines" / FP32
    m = _manifest(base)
    m["engine"]["options"]["replayed_from"] = "baselines/old"  # what a capture of a recorded engine writes
    rewrite(base, records(base), m)
    r = cli("noise", "gates/cap.toml")
    assert r.exit_code == 2 and "one run repeated" in r.output


def test_a_config_capturing_other_k_than_its_baseline_is_refused(here):
    shutil.copy(ROOT / "gates" / "capture-vllm-fp32.toml", here / "gates")
    text = (here / "gates" / "capture-vllm-fp32.toml").read_text().replace("runs = 5", "runs = 7")
    (here / "gates" / "capture-vllm-fp32.toml").write_text(text)
    r = cli("noise", "gates/capture-vllm-fp32.toml", "--baseline", f"baselines/{FP32}")
    assert r.exit_code == 2 and "K = 7" in r.output and "K = 5" in r.output


def _profiled(here, *against: str):
    args = [a for b in against for a in ("--against", b)]
    assert cli("noise", "gates/cap.toml", *args).exit_code == 0
    return here / "baselines" / FP32 / "noise.json"


def test_a_profile_edited_after_capture_is_refused(here):
    plant_self_flip(here / "baselines" / FP32)
    path = _profiled(here)
    raw = json.loads(path.read_text())
    raw["largest_self_flip_gap"] = 2.0  # widen the band by hand
    path.write_text(json.dumps(raw))
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "edited after it was measured" in r.output and "noise.json" in r.output


def test_a_resealed_profile_whose_figures_its_flips_contradict_is_refused(here):
    plant_self_flip(here / "baselines" / FP32)
    path = _profiled(here)
    raw = json.loads(path.read_text())
    raw["self_flips"][0]["gaps"] = [3.0, None]
    raw["self_flips"][0]["gap"] = 3.0
    raw["seal"] = seal_of(raw)  # a tool that knows the checksum: the figures still have to add up
    path.write_text(json.dumps(raw))
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "states (flips, prompts, largest gap, unknown)" in r.output


def test_a_profile_of_another_model_is_refused(here):
    _profiled(here)
    other = here / "other-llama"
    shutil.copytree(ROOT / "strict_gate" / "models" / "tiny-llama", other)
    cfg = other / "config.json"
    cfg.write_text(cfg.read_text() + "\n")  # another checkpoint: other files, another digest
    path = gate(here, band="measured", noise={"profile": f"../baselines/{FP32}/noise.json"})
    path.write_text(path.read_text().replace('model = "bundled:tiny-llama"', 'model = "../other-llama"', 1))
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "does not fit this gate" in r.output and "profiles model" in r.output


def test_a_profile_of_another_dtype_is_refused(here):
    _profiled(here)
    gate(here, reference=BF16, candidate=FP32, band="measured", noise={"profile": f"../baselines/{FP32}/noise.json"})
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "measured in dtype float32" in r.output and "bfloat16" in r.output


def _small_battery(here) -> None:
    """prompts/small.jsonl: battery-128's first 16 prompts, another battery than the profile's."""
    lines = (here / "prompts" / "battery-128.jsonl").read_text().splitlines(keepends=True)
    (here / "prompts" / "small.jsonl").write_text("".join(lines[:16]))


def test_a_profile_of_another_battery_is_refused(here):
    _profiled(here)
    _small_battery(here)
    gate(here, band="measured", prompts="../prompts/small.jsonl")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "measured on battery 'battery-128'" in r.output


def test_a_profile_over_a_recaptured_baseline_is_refused(here):
    _profiled(here)
    base = here / "baselines" / FP32
    recs = records(base)
    recs[0]["timing"] = {"ttft_s": 0.5, "total_s": 1.0}  # the same tokens, another capture
    rewrite(base, recs)
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "re-captured after the profile" in r.output


def test_a_measured_band_needs_a_profile(here):
    gate(here, band="measured")  # no noise.json beside the baseline
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "no noise profile here" in r.output
    gate(here, band="loose")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and 'give a number of nats >= 0 or "measured"' in r.output


def test_a_measured_band_over_self_flips_of_unknown_gap_is_refused(here):
    base = here / "baselines" / FP32
    pos, _ = plant_self_flip(base)
    recs = records(base)
    rec = next(r for r in recs if r["id"] == "prose-001")
    rec["samples"][-1][pos] = 999  # a token outside the golden's top-5: no gap is known
    rewrite(base, recs)
    _profiled(here)
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "a gap no side knows" in r.output


def test_a_profile_that_is_not_json_or_not_a_profile_is_refused(here):
    path = _profiled(here)
    gate(here, band="measured")
    for text, words in (("{not json", "is not JSON"), ('{"schema": "strict-gate/report@2"}', "not a noise profile"),
                        ('{"schema": "strict-gate/noise@1", "x": NaN}', "is not JSON")):
        path.write_text(text)
        r = cli("gate", "gates/gate.toml")
        assert r.exit_code == 2 and words in r.output, r.output


def test_a_profile_with_a_field_this_version_does_not_know_is_refused(here):
    path = _profiled(here)
    raw = json.loads(path.read_text())
    raw["variations"][0]["trust_me"] = True
    raw["seal"] = seal_of(raw)
    path.write_text(json.dumps(raw))
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "malformed" in r.output and "trust_me" in r.output


# ---- issue 36: a profile of another engine, or resealed to widen the band, names the field it breaks


def _resealed(path, edit) -> None:
    """The profile edited by a tool that knows the seal and keeps every figure adding up
    (noise/profile.py's sealed(): the largest gaps recomputed from the flips)."""
    import msgspec

    from strict_gate.noise.profile import NoiseProfile, write_profile

    raw = json.loads(path.read_text())
    edit(raw)
    for v in raw["variations"]:  # each variation's counts, from its (edited) flips
        flips = [f for f in raw["self_flips"] if f["variation"] == v["name"]]
        known = [f["gap"] for f in flips if f["gap"] is not None]
        v["largest_gap"] = max(known) if known else None
    write_profile(msgspec.convert(raw, NoiseProfile), path)


def _band(here) -> float:
    (d,) = (here / "gates" / "reports").iterdir()
    return json.loads((d / "report.json").read_text())["band"]


def test_a_profile_of_another_engine_is_refused(here):
    """The same model, dtype and battery, measured by another engine kind (transformers' noise is
    not vLLM's): refused, naming provenance.engine."""
    path = _profiled(here)
    _resealed(path, lambda raw: raw["provenance"].update(engine="hf"))
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output  # before: accepted, the gate ran on it
    assert "provenance.engine" in r.output and "'hf'" in r.output and "'vllm'" in r.output


def test_a_profile_counting_a_second_build_as_its_own_noise_is_refused(here):
    """A second build (bf16) marked same_build: its flips (gaps up to ~1 nat) would set the band."""
    path = _profiled(here, f"baselines/{BF16}")
    build = next(i for i, v in enumerate(json.loads(path.read_text())["variations"]) if v["kind"] == "second_build")
    _resealed(path, lambda raw: raw["variations"][build].update(same_build=True))
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output  # before: accepted, the bf16 build's flips in the band
    assert f"variations[{build}].same_build" in r.output and "second_build" in r.output


def test_a_profile_without_its_baselines_sha256_is_refused(here):
    """baseline_sha256 set to null hides a re-captured baseline: a recorded reference's profile
    must name the records it was measured on."""
    path = _profiled(here)
    _resealed(path, lambda raw: raw["provenance"].update(baseline_sha256=None))
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output  # before: accepted
    assert "provenance.baseline_sha256" in r.output


def test_a_self_flip_whose_gap_its_logprobs_contradict_is_refused(here):
    """A self-flip's gap widened (2 nats) without its logprobs: the two disagree."""
    plant_self_flip(here / "baselines" / FP32)
    path = _profiled(here)

    def widen(raw):
        f = raw["self_flips"][0]
        f["gaps"], f["gap"] = [2.0, f["gaps"][1]], 2.0
    _resealed(path, widen)
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output  # before: accepted, band 2.0
    assert "self_flips[0].gaps" in r.output and "logprobs" in r.output


def test_a_k_run_flip_the_baseline_does_not_hold_is_refused(here):
    """The K-run flips are the baseline's own samples, re-derived from its records: one widened
    with its gap and logprobs in step is not what the baseline holds."""
    plant_self_flip(here / "baselines" / FP32)
    path = _profiled(here)

    def widen(raw):
        f = raw["self_flips"][0]
        f["logprobs"] = [f["logprobs"][0], f["logprobs"][0] - 2.0]
        f["gaps"], f["gap"] = [2.0, None], 2.0
    _resealed(path, widen)
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output  # before: accepted, band 2.0
    assert "variations[0] (runs-5)" in r.output and "are not what the baseline's records hold" in r.output


def test_a_profile_measured_over_more_tokens_than_the_gate_judges_is_refused(here):
    """max_tokens 16 in the profile, 8 in the gate: its flips past position 8 would set the band."""
    _profiled(here)
    gate(here, band="measured", max_tokens=8)
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output
    assert "provenance.max_tokens" in r.output


def test_a_field_refused_is_named_for_model_dtype_and_battery(here):
    """The refusals that were there name their field too."""
    _profiled(here)
    gate(here, reference=BF16, candidate=FP32, band="measured", noise={"profile": f"../baselines/{FP32}/noise.json"})
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "provenance.dtype" in r.output and "provenance.model_digest" not in r.output
    _small_battery(here)
    gate(here, band="measured", prompts="../prompts/small.jsonl")
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2 and "provenance.battery.sha256" in r.output


# ---- issue 36: `compare` takes the profile as a gate does, and refuses what a gate refuses


def test_compare_judges_against_a_noise_profile_and_its_measured_band(here):
    """Two stored runs and the reference's profile, relative paths from the user's directory:
    band = "measured" is the profile's rule, and the report places each flip against it."""
    plant_self_flip(here / "baselines" / FP32)
    _profiled(here)
    r = cli("compare", f"baselines/{FP32}", f"baselines/{BF16}", "--policy", "near-tie", "--band", "measured",
            "--noise", f"baselines/{FP32}/noise.json", "--noise-floor", "0.05", "--out", "cmp")
    assert r.exit_code in (1, 3), r.output  # before: exit 2, "No such option: --noise"
    report = json.loads((here / "cmp" / "report.json").read_text())
    rule = section(report, "noise")["band_rule"]
    assert rule.startswith("band = max(floor 0.05 nats, largest self-flip gap") and report["band"] == pytest.approx(
        max(0.05, section(report, "noise")["largest_self_flip_gap"] or 0.0))
    assert "band = max(floor 0.05 nats" in (here / "cmp" / "report.md").read_text()


@pytest.mark.parametrize("edit, field", [
    (lambda raw: raw["provenance"].update(dtype="bfloat16"), "provenance.dtype"),
    (lambda raw: raw["provenance"].update(engine="hf"), "provenance.engine"),
])
def test_compare_refuses_a_profile_that_does_not_fit_the_reference_run(here, edit, field):
    path = _profiled(here)
    _resealed(path, edit)
    r = cli("compare", f"baselines/{FP32}", f"baselines/{BF16}", "--band", "measured", "--noise", str(
        path.relative_to(here)))
    assert r.exit_code == 2 and field in r.output and "noise.json" in r.output, r.output


def test_compare_refuses_a_measured_band_without_a_profile_and_an_edited_one(here):
    r = cli("compare", f"baselines/{FP32}", f"baselines/{BF16}", "--band", "measured")
    assert r.exit_code == 2 and "give --noise PROFILE" in r.output, r.output
    path = _profiled(here)
    raw = json.loads(path.read_text())
    raw["largest_self_flip_gap"] = 2.0
    path.write_text(json.dumps(raw))
    r = cli("compare", f"baselines/{FP32}", f"baselines/{BF16}", "--band", "measured", "--noise",
            f"baselines/{FP32}/noise.json")
    assert r.exit_code == 2 and "edited after it was measured" in r.output, r.output


# ---- issue 50 item 2: a profile or a [noise] key that cannot be read names the file (and line), exit 2


def test_a_profile_holding_a_number_out_of_a_floats_range_is_refused_naming_it(here):
    """`1e999` is valid JSON that reads as inf: the seal's canonical JSON cannot hold it."""
    path = _profiled(here)
    path.write_text(path.read_text().replace('"largest_magnitude": null', '"largest_magnitude": 1e999'))
    assert "1e999" in path.read_text()
    gate(here, band="measured")
    for args in (("gate", "gates/gate.toml"), ("compare", f"baselines/{FP32}", f"baselines/{BF16}", "--band",
                                               "measured", "--noise", f"baselines/{FP32}/noise.json")):
        r = cli(*args)  # before: ValueError traceback, exit 1
        assert r.exit_code == 2, r.output
        assert "noise.json" in r.output and "1e999" in r.output and "out of a float's range" in r.output


def test_a_noise_key_of_the_wrong_type_names_the_config_file_and_line(here):
    gate(here, band="measured", noise={"profile": 5})
    line = next(i for i, s in enumerate((here / "gates" / "gate.toml").read_text().splitlines(), 1)
                if s.startswith("profile"))
    r = cli("gate", "gates/gate.toml")
    assert r.exit_code == 2, r.output
    assert f"gates/gate.toml:{line}: [noise] profile = 5 has the wrong type" in r.output  # before: no file, no line


def test_a_profile_nested_too_deep_to_read_is_refused_naming_it(here):
    path = _profiled(here)
    path.write_text("[" * 200_000 + "]" * 200_000)
    gate(here, band="measured")
    r = cli("gate", "gates/gate.toml")  # before: RecursionError traceback, exit 1
    assert r.exit_code == 2 and "noise.json" in r.output and "is not JSON" in r.output, r.output
