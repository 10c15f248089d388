"""`localize = true` in a gate and `strict-gate localize REPORT_DIR`, with real hf engines.

The candidate is the bundled model with layer 1's MLP down projection scaled by 3 (a bug big
enough to change tokens on the smoke prompts); every report format must name layers.1.mlp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need
from helpers import write_gate
from test_localize import plant

from strict_gate.core.model_files import resolve_model
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate

need("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PLANTED = "layers.1.mlp"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gate")
    src = Path(resolve_model("bundled:tiny-llama", ROOT))
    bad = plant(src, tmp / "planted", "model.layers.1.mlp.down_proj.weight", scale=3.0)
    cfg = write_gate(tmp, prompts=str(ROOT / "prompts/smoke.jsonl"), max_tokens=8, policy="strict",
                     output_dir=str(tmp / "reports"), localize=True,
                     reference={"kind": "hf", "model": str(src)}, candidate={"kind": "hf", "model": str(bad)})
    return run_gate(load_gate_config(cfg)).report_dir


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          env=os.environ | {"COLUMNS": "200"}, timeout=600)


def test_every_report_format_names_the_planted_layer(report_dir):
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    localised = [p for p in report["prompts"] if p.get("localization")]
    divergent = [p for p in report["prompts"] if p["status"] == "divergent"]
    assert divergent and len(localised) == len(divergent)
    for p in localised:
        loc = p["localization"]
        assert loc["first_beyond"] == PLANTED and loc["mode"] == "grafted"
        assert loc["grafted_beyond"] and {n.split(".")[1] for n in loc["grafted_beyond"]} == {"1"}
        assert {"name", "max_abs", "rel_diff", "cosine"} <= set(loc["points"][0])
        assert loc["reference_engine"].startswith("hf ") and loc["tolerance"] == 1e-10
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    assert "## Localisation" in md and f"| {PLANTED} |" in md
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert "<svg" in html and "tolerance 1e-10" in html and PLANTED in html
    assert not (report_dir / "localize").exists()  # no --keep: no tensors left


def test_show_prints_the_localisation(report_dir):
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    pid = next(p["id"] for p in report["prompts"] if p.get("localization"))
    out = cli("show", str(report_dir), "--prompt", pid)
    assert out.returncode == 0, out.stderr
    assert f"first beyond tolerance: {PLANTED}" in out.stdout


def test_localize_command_rewrites_the_reports_and_keeps_tensors_with_keep(report_dir):
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    pid = next(p["id"] for p in report["prompts"] if p.get("localization"))
    out = cli("localize", str(report_dir), "--prompt", pid, "--points", "embed,layers.0,layers.1,layers.1.mlp",
              "--positions", "3", "--keep")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"first beyond tolerance: {PLANTED}" in out.stdout
    again = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    loc = next(p["localization"] for p in again["prompts"] if p["id"] == pid)
    assert [p["name"] for p in loc["points"]] == ["embed", "layers.0", "layers.1.mlp", "layers.1"]
    assert len(loc["positions"]) == 3 and loc["kept"] and list(Path(loc["kept"]).rglob("*.safetensors"))
    assert again["verdict"] == report["verdict"]  # the verdict and diagnoses are kept as they were
    assert [p.get("diagnosis") for p in again["prompts"]] == [p.get("diagnosis") for p in report["prompts"]]


@pytest.mark.parametrize(("args", "words"), [
    (("--points", "layers.0.ffn"), "unknown point name"),
    (("--prompt", "no-such-prompt"), "is not in the report"),
    (("--tolerance", "2"), "tolerance must be a number in (0, 1)"),
])
def test_bad_input_exits_2(report_dir, args, words):
    out = cli("localize", str(report_dir), *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in out.stdout + out.stderr


def test_a_matching_prompt_or_a_report_without_divergence_exits_2(report_dir, tmp_path):
    report = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    matched = [p["id"] for p in report["prompts"] if p["status"] == "match"]
    if matched:
        out = cli("localize", str(report_dir), "--prompt", matched[0])
        assert out.returncode == 2 and "did not diverge" in out.stdout + out.stderr
    out = cli("localize", str(tmp_path))
    assert out.returncode == 2 and "report.json is missing" in out.stdout + out.stderr


def test_kda_recurrent_gate_names_a_kda_block_for_its_flip(tmp_path):
    """gates/kda-recurrent.toml as shipped (localize = "all", bf16), on the flip of the battery
    that was divergent by its decode top-k alone (multi-006; a near-tie once both sides are
    re-scored): the first point that differs, and grafted the first that differs on its own, is a
    KDA attention block in every report format."""
    from dataclasses import replace

    line = next(x for x in (ROOT / "prompts/battery-128.jsonl").read_text(encoding="utf-8").splitlines()
                if json.loads(x)["id"] == "multi-006")
    (tmp_path / "one.jsonl").write_text(line + "\n", encoding="utf-8")
    cfg = load_gate_config(ROOT / "gates/kda-recurrent.toml")
    assert cfg.feature("localize") is not None
    cfg = replace(cfg, prompts=tmp_path / "one.jsonl", output_dir=tmp_path / "reports")
    outcome = run_gate(cfg)
    kda_blocks = {"layers.0.attn", "layers.1.attn", "layers.2.attn"}  # layer 3 is the MLA one
    loc = outcome.result.localization["multi-006"]
    assert loc.first_differs in kda_blocks and loc.grafted_differs in kda_blocks, loc.to_json()
    md = (outcome.report_dir / "report.md").read_text(encoding="utf-8")
    row = next(x for x in md.splitlines() if x.startswith("| `multi-006` |"))
    assert f"| {loc.first_differs} |" in row and f"| {loc.grafted_differs} |" in row
    html = (outcome.report_dir / "report.html").read_text(encoding="utf-8")
    assert f"first to differ alone: {loc.grafted_differs}" in html
    report = json.loads((outcome.report_dir / "report.json").read_text(encoding="utf-8"))
    assert report["prompts"][0]["localization"]["grafted_differs"] == loc.grafted_differs
