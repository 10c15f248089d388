"""A committed CPU baseline judged against a run on CUDA: the report names the devices, and
where only the device differs (same engine kind, model files, dtype) says how many prompts the
device alone changes; in report.md, report.json and on the console."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from strict_gate.cli import app

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "baselines" / "tiny-llama-vllm-fp32"


def gpu_run(to: Path, *, device: dict | None, effective_device: str | None = "cuda", flip: int = 1) -> Path:
    """The CPU baseline's records as if a CUDA vLLM had made them, the last token of `flip`
    prompts changed to the runner-up (greedy still: the logprobs are swapped with it)."""
    shutil.copytree(BASELINE, to)
    m = json.loads((to / "manifest.json").read_text())
    opts = m["engine"]["options"]
    if effective_device is None:
        opts["effective"].pop("device_type", None)
    else:
        opts["effective"]["device_type"] = effective_device
    opts.pop("device_info", None)
    if device is not None:
        opts["device_info"] = device
    m["runs"] = 1
    m.pop("determinism", None)
    (to / "manifest.json").write_text(json.dumps(m))
    lines = (to / "records.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        r = json.loads(line)
        r.pop("samples", None)  # one run, not the baseline's K
        if i < flip:
            (a, la), (b, lb) = r["top_logprobs"][-1][:2]
            r["token_ids"][-1] = b
            r["top_logprobs"][-1][:2] = [[b, la], [a, lb]]
        lines[i] = json.dumps(r)
    (to / "records.jsonl").write_text("\n".join(lines) + "\n")
    return to


def compare(tmp_path, monkeypatch, cand: str) -> tuple[str, dict, str]:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(BASELINE, "cpu")
    result = CliRunner().invoke(app, ["compare", "cpu", cand, "--out", "out"])
    assert result.exit_code in (0, 1), result.output
    return Path("out/report.md").read_text(), json.loads(Path("out/report.json").read_text()), result.output


def test_a_cpu_baseline_against_a_cuda_run_names_the_device_and_what_it_alone_changes(tmp_path, monkeypatch):
    gpu_run(tmp_path / "gpu", device={"type": "cuda", "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}, flip=3)
    md, rep, console = compare(tmp_path, monkeypatch, "gpu")
    said = "the device alone changes 3 prompts of 128"
    assert any("devices differ" in n and "ran on cpu" in n and "on cuda" in n and said in n for n in rep["notes"])
    assert said in md and said in " ".join(console.split())


def test_another_dtype_is_not_the_device_alone(tmp_path, monkeypatch):
    run = gpu_run(tmp_path / "gpu", device={"type": "cuda"})
    m = json.loads((run / "manifest.json").read_text())
    m["engine"]["options"]["effective"]["dtype"] = "torch.bfloat16"
    (run / "manifest.json").write_text(json.dumps(m))
    _, rep, _ = compare(tmp_path, monkeypatch, "gpu")
    (note,) = [n for n in rep["notes"] if "devices differ" in n]
    assert "alone" not in note
