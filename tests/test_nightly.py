"""The nightly loop end to end: scripts/nightly.sh run twice, as a CI would, with the real
hf engine. Night 1: the candidate (transformers, float32) against a baseline captured here
from the same model passes. Night 2: one weight tensor of the candidate is nudged (layer 1's
MLP down-projection scaled by 1.1), some prompts flip, and the night-to-night diff names them
and fails the job. The workflow file cannot run here; it is checked to call the same script."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need
from helpers import write_gate

need("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "prompts" / "smoke.jsonl"
BUNDLED = ROOT / "strict_gate" / "models" / "tiny-llama"
NUDGED = "model.layers.1.mlp.down_proj.weight"
SCALE = 1.1  # flips 4 of the 8 smoke prompts within 8 tokens here (1.05 flips the same 4)


def sg(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def nudge(model_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    tensors[NUDGED] = tensors[NUDGED] * SCALE
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.fixture()
def setup(tmp_path):
    """A tiny baseline captured with hf (8 smoke prompts, 8 tokens, K = 2) and a gate whose
    candidate is a copy of the model that night 2 nudges."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "STRICT_GATE": f"{sys.executable} -m strict_gate.cli",
                        "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md")}
    env.pop("NIGHTLY_PREVIOUS", None)
    hf = {"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"}
    write_gate(tmp_path, file="capture.toml", name="tiny-hf", prompts=SMOKE, max_tokens=8, top_logprobs=5, reference=hf)
    r = sg("capture", "capture.toml", "--runs", "2", "--out", "baseline", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    shutil.copytree(BUNDLED, tmp_path / "candidate-model")
    write_gate(tmp_path, name="nightly-tiny", prompts=SMOKE, max_tokens=8, top_logprobs=5, policy="auto",
               reference={"kind": "recorded", "path": "baseline", "model": "bundled:tiny-llama"},
               candidate=hf | {"model": "candidate-model"}, rescorer=hf)
    return tmp_path, env | {"NIGHTLY_CONFIG": str(tmp_path / "gate.toml"), "NIGHTLY_OUTPUT": "out"}


def night(tmp_path, env):
    return subprocess.run(["bash", str(ROOT / "scripts" / "nightly.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def report_dirs(out: Path) -> list[Path]:
    return sorted((p for p in out.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)


def test_two_nights_regression_named_and_exit_1(setup):
    tmp_path, env = setup
    out = tmp_path / "out"

    first = night(tmp_path, env)
    assert first.returncode == 0, first.stdout + first.stderr
    (n1,) = report_dirs(out)
    rep1 = json.loads((n1 / "report.json").read_text())
    assert rep1["verdict"] == "pass" and rep1["summary"]["prompts_exact"] == 8
    assert "no previous night" in (out / "summary.md").read_text() and not (n1 / "diff.json").exists()
    assert len(rep1["history"]) == 1

    nudge(tmp_path / "candidate-model")
    second = night(tmp_path, env)
    assert second.returncode == 1, second.stdout + second.stderr
    n1_, n2 = report_dirs(out)
    assert n1_ == n1
    rep2 = json.loads((n2 / "report.json").read_text())
    flipped = sorted(p["id"] for p in rep2["prompts"] if p["status"] != "match")
    assert flipped and rep2["verdict"] == "fail", "the nudge must flip some prompts"

    diff = json.loads((n2 / "diff.json").read_text())
    assert diff["regression"] is True and sorted(diff["stopped_matching"]) == flipped
    assert {r["rule"] for r in diff["regressions"]} >= {"new-failure", "status-worse", "positions-drop"}
    assert any(c["what"] == "candidate model digest" for c in diff["context"])
    assert diff["positions_matched_common"]["delta"] < 0
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# FAIL: nightly-tiny") and "## Night to night: REGRESSION" in summary
    for pid in flipped:
        assert re.search(rf"\| {pid} \| match \| \w+ \| yes -> no \|", summary), pid
    assert "## Night to night: REGRESSION" in second.stdout  # the console shows the diff too
    # the step summary (GitHub) got both nights
    step = (tmp_path / "step-summary.md").read_text()
    assert step.count("# PASS: nightly-tiny") == 1 and step.count("# FAIL: nightly-tiny") == 1

    # history: two lines, and the trend in tonight's reports
    lines = (out / "history.jsonl").read_text().splitlines()
    assert len(lines) == 2
    h1, h2 = map(json.loads, lines)
    assert (h1["verdict"], h2["verdict"]) == ("pass", "fail") and h2["report_dir"] == n2.name
    assert h2["prompts"] == {"exact": 8 - len(flipped), "total": 8}
    assert h2["reference"]["baseline"].endswith("baseline") and h2["candidate"]["kind"] == "hf"
    assert rep2["history"] == [h1, h2]
    md = (n2 / "report.md").read_text()
    assert "## Trend (last 2 nights)" in md and md.count("| pass | 8/8 |") == 1
    html = (n2 / "report.html").read_text()
    assert "<h2>Trend</h2>" in html and html.count("<circle") == 2 and "prompts exact 8/8" in html

    # the diff command on its own gives the same answer, and --fail-on none only reports
    r = sg("diff", n1, n2, "--json", tmp_path / "d.json", cwd=tmp_path, env=env)
    assert r.returncode == 1 and json.loads((tmp_path / "d.json").read_text())["stopped_matching"] == diff["stopped_matching"]
    assert sg("diff", n1, n2, "--fail-on", "none", "--json", tmp_path / "d.json", cwd=tmp_path, env=env).returncode == 0
    print(f"\nnudged {NUDGED} x{SCALE}: regressed prompts {flipped}; "
          f"positions {diff['positions_matched_common']['old']} -> {diff['positions_matched_common']['new']}")

