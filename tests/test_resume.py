"""`strict-gate gate --resume REPORT_DIR`: an interrupted gate continues where it stopped.

The offline tests interrupt a gate of stored runs (the `recorded` engine, no torch) from
inside; the slow test sends SIGINT to a real hf gate running in a subprocess.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import confident, rec, step, write_gate, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.seal import next_seal

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
# What must not differ between a resumed gate and an uninterrupted one.
SAME = ("verdict", "policy", "band", "reasons", "summary", "prompt_set", "sampling", "config", "problems")


def offline_gate(tmp_path: Path, n: int = 6) -> Path:
    """n prompts; the candidate flips a near-tie on p2 and diverges on p4: a failing gate."""
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, i]}) + "\n" for i in range(n)))
    sha = load_prompts(prompts).sha256
    ref = [rec(f"p{i}", [10 + i, 20, 30], prompt=(1, 2, i)) for i in range(n)]
    ref[2] = rec("p2", [12, 20, 30], prompt=(1, 2, 2),
                 tops=[confident(12), step((20, -0.6), (40, -0.7)), confident(30)])
    cand = list(ref)
    cand[2] = rec("p2", [12, 40, 30], prompt=(1, 2, 2),
                  tops=[confident(12), step((40, -0.65), (20, -0.68)), confident(30)])
    cand[4] = rec("p4", [14, 99, 30], prompt=(1, 2, 4))
    write_run(tmp_path / "ref", ref, sha=sha, max_tokens=3, model="tiny")
    write_run(tmp_path / "cand", cand, sha=sha, max_tokens=3, model="tiny")
    return write_gate(tmp_path, name="offline", prompts="set.jsonl", max_tokens=3, policy="near-tie",
                      output_dir=tmp_path / "reports", reference={"kind": "recorded", "path": "ref", "model": "tiny"},
                      candidate={"kind": "recorded", "path": "cand", "env": {"FLAG": "1"}})  # [candidate.env] last


def interrupted(config: Path, out: Path, arm: str = "candidate", after: int = 2) -> Path:
    """Run the gate and Ctrl-C it once `arm` has written `after` records; the report dir."""

    def progress(label, total):
        seen = []

        def on_record(record, seconds):
            seen.append(record.id)
            if label == arm and len(seen) == after:
                raise KeyboardInterrupt

        return on_record

    with pytest.raises(KeyboardInterrupt):
        run_gate(load_gate_config(config), output_dir=out, progress=progress)
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    return d


def uninterrupted(config: Path, out: Path) -> tuple[int, dict]:
    r = runner.invoke(app, ["gate", str(config), "-o", str(out)])
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    return r.exit_code, json.loads((d / "report.json").read_text())


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def reseal(run_dir: Path, lines: list[str], role: str) -> None:
    """Write records.seal for `lines` as the gate's RunWriter would (the key from gate-state.json)."""
    prev = json.loads((run_dir.parent / "gate-state.json").read_text())["seal_key"] + ":" + role
    seals = []
    for line in lines:
        prev = next_seal(prev, line.encode())
        seals.append(prev + "\n")
    (run_dir / "records.seal").write_text("".join(seals))


def set_versions(run_dir: Path, versions: dict) -> None:
    m = manifest(run_dir)
    m["engine"]["versions"] = versions
    (run_dir / "manifest.json").write_text(json.dumps(m))


def test_interrupted_offline_gate_resumes_to_the_same_report(tmp_path):
    config = offline_gate(tmp_path)
    d = interrupted(config, tmp_path / "r")
    m = manifest(d / "candidate")
    assert m["status"] == "failed" and m["records"] == 2 and "interrupted" in m["error"]
    assert not (d / "reference").exists() and not (d / "report.json").exists()
    before = (d / "candidate" / "records.jsonl").read_bytes()

    r = runner.invoke(app, ["gate", "--resume", str(d)])
    code, want = uninterrupted(config, tmp_path / "u")
    assert r.exit_code == code == 1, r.output
    assert "candidate kept 2, generated 4; reference kept 0, generated 6" in r.output
    got = json.loads((d / "report.json").read_text())
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert got["prompts"] == want["prompts"]
    assert got["config"]["path"] == str(config.resolve())

    m = manifest(d / "candidate")
    assert m["status"] == "complete" and m["records"] == 6
    assert [(e["kept"], e["remaining"]) for e in m["resumed"]] == [(2, 4)]
    assert (d / "candidate" / "records.jsonl").read_bytes().startswith(before)
    assert "resumed" not in manifest(d / "reference")
    assert got["resumed"] == {"candidate": m["resumed"]} and want["resumed"] == {}
    assert "| candidate run resumed | at " in (d / "report.md").read_text()


def test_killed_run_drops_its_torn_tail_and_error_records(tmp_path):
    """A SIGKILL leaves status running and a .partial file; a torn last line and an error
    record are not kept (the error prompt is generated again); the rest is kept byte for byte."""
    config = offline_gate(tmp_path)
    d = interrupted(config, tmp_path / "r", arm="reference", after=4)
    run = d / "reference"
    lines = (run / "records.jsonl").read_text().splitlines(keepends=True)
    err = json.loads(lines[1])
    err.update(token_ids=[], finish_reason=None, top_logprobs=None, error="engine said no")
    whole = [lines[0], json.dumps(err) + "\n", lines[2]]
    (run / "records.jsonl.partial").write_text("".join(whole) + lines[3][:40])
    (run / "records.jsonl").unlink()
    reseal(run, whole, "reference")  # as the gate's writer seals the lines it wrote
    m = manifest(run)
    m["status"] = "running"
    (run / "manifest.json").write_text(json.dumps(m))

    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == 1, r.output
    assert "candidate kept 6, generated 0; reference kept 2, generated 4" in r.output
    m = manifest(run)
    assert m["status"] == "complete" and m["records"] == 6 and m["resumed"][0]["kept"] == 2
    assert "error" not in m and not (run / "records.jsonl.partial").exists()
    new = (run / "records.jsonl").read_text().splitlines(keepends=True)
    assert new[:2] == [lines[0], lines[2]]
    assert sorted(json.loads(x)["id"] for x in new) == [f"p{i}" for i in range(6)]
    assert all("error" not in json.loads(x) for x in new)
    _, want = uninterrupted(config, tmp_path / "u")
    got = json.loads((d / "report.json").read_text())
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}


def test_a_finished_gate_is_rejudged_and_left_as_it_is(tmp_path):
    config = offline_gate(tmp_path)
    code, _ = uninterrupted(config, tmp_path / "u")
    (d,) = [p for p in (tmp_path / "u").iterdir() if p.is_dir()]
    stamps = {p.name: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}
    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == code == 1, r.output
    assert "nothing to resume" in r.output and "FAIL" in r.output
    assert stamps == {p.name: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda t: t.replace("max_tokens = 3", "max_tokens = 4"), "max_tokens changed"),
        (lambda t: t.replace('FLAG = "1"', 'FLAG = "0"'), "[candidate.env] FLAG changed"),
        (lambda t: t + 'OTHER = "1"\n', "[candidate.env] OTHER was added"),
        (lambda t: t.replace('policy = "near-tie"', 'policy = "strict"'), "policy changed"),
        (lambda t: t.replace('model = "tiny"', 'model = "huge"'), "[reference] model changed"),
    ],
)
def test_resume_refuses_a_changed_config(tmp_path, edit, field):
    d = interrupted(offline_gate(tmp_path), tmp_path / "r")
    toml = d / "gate.toml"
    toml.write_text(edit(toml.read_text()))
    before = (d / "candidate" / "records.jsonl").read_bytes()
    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == 2, r.output
    assert field in r.output and f"{toml}:" in r.output.replace("\n", "")
    assert (d / "candidate" / "records.jsonl").read_bytes() == before  # nothing was touched


def test_resume_refuses_a_changed_prompt_set_and_bad_input(tmp_path):
    config = offline_gate(tmp_path)
    d = interrupted(config, tmp_path / "r")
    r = runner.invoke(app, ["gate", "--resume", str(d), "--policy", "strict"])
    assert r.exit_code == 2 and "give no CONFIG, --policy" in r.output
    r = runner.invoke(app, ["gate", str(config), "--resume", str(d)])
    assert r.exit_code == 2

    prompts = tmp_path / "set.jsonl"
    original = prompts.read_text()
    prompts.write_text(original.replace('"p5"', '"p5x"'))
    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == 2 and "prompt set sha256" in r.output and "changed" in r.output
    prompts.write_text(original)

    cand = d / "candidate" / "records.jsonl"
    good = cand.read_text()
    cand.write_text(good.replace('"token_ids": [', '"token_ids": "x", "_": [', 1))
    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == 2 and "records.jsonl:1:" in r.output.replace("\n", "")
    cand.write_text(good)

    (d / "gate-state.json").unlink()
    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == 2 and "gate-state.json is missing" in r.output.replace("\n", " ")
    r = runner.invoke(app, ["gate", "--resume", str(tmp_path / "ref")])
    assert r.exit_code == 2 and "not a gate report directory" in r.output


def test_resume_refuses_an_engine_whose_versions_changed(tmp_path):
    """A run is what one engine produced: the kept prompts and the new ones must share versions."""
    config = offline_gate(tmp_path)
    set_versions(tmp_path / "cand", {"lib": "1"})  # the replayed engine, as the resume will see it
    d = interrupted(config, tmp_path / "r")
    set_versions(d / "candidate", {"lib": "0"})  # as if the interrupted part ran on another version
    r = runner.invoke(app, ["gate", "--resume", str(d)])
    assert r.exit_code == 2 and "lib 0 -> 1" in r.output, r.output
    m = manifest(d / "candidate")
    assert m["status"] == "failed" and m["records"] == 2 and "engine changed" in m["error"]


# ---------------------------------------------------------------- a real hf gate, interrupted


def hf_gate_config(tmp_path: Path) -> Path:
    """hf float32 reference against hf bfloat16 candidate on 16 battery prompts."""
    prompts = tmp_path / "battery-16.jsonl"
    prompts.write_text("".join((REPO / "prompts" / "battery-128.jsonl").read_text().splitlines(keepends=True)[:16]))
    return write_gate(tmp_path, file="hf.toml", name="hf-resume", prompts="battery-16.jsonl", max_tokens=16, policy="auto",
                      reference={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"},
                      candidate={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "bfloat16", "threads": 1})


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "strict_gate.cli", *args]


@pytest.mark.slow
def test_sigint_mid_candidate_then_resume_equals_an_uninterrupted_hf_gate(tmp_path):
    from conftest import need

    need("transformers")
    config = hf_gate_config(tmp_path)
    env = os.environ | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cli("gate", str(config), "-o", str(tmp_path / "r")), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    partial = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((tmp_path / "r").glob("*/candidate/records.jsonl.partial"))
        if found and found[0].read_text().count("\n") >= 3:
            partial = found[0]
            break
        time.sleep(0.005)
    assert partial is not None, "the candidate never got going: " + proc.communicate()[0].decode()[-2000:]
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 3, out
    d = partial.parent.parent
    kept = len(load_run(d / "candidate", allow_incomplete=True).records)
    assert manifest(d / "candidate")["status"] == "failed" and 3 <= kept < 16
    before = (d / "candidate" / "records.jsonl").read_bytes()

    t0 = time.monotonic()
    r = subprocess.run(cli("gate", "--resume", str(d)), cwd=tmp_path, env=env, capture_output=True, text=True)
    resume_s = time.monotonic() - t0
    assert f"candidate kept {kept}, generated {16 - kept}; reference kept 0, generated 16" in r.stderr, r.stderr
    m = manifest(d / "candidate")
    assert m["status"] == "complete" and m["records"] == 16
    assert [(e["kept"], e["remaining"]) for e in m["resumed"]] == [(kept, 16 - kept)]
    # the prompts done before the interruption were not generated again: their lines, timings
    # included, are byte for byte what the interrupted run wrote
    assert (d / "candidate" / "records.jsonl").read_bytes().startswith(before)

    u = subprocess.run(cli("gate", str(config), "-o", str(tmp_path / "u")), cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == u.returncode in (0, 1), r.stderr + u.stderr
    (ud,) = [p for p in (tmp_path / "u").iterdir() if p.is_dir()]
    got, want = (json.loads((x / "report.json").read_text()) for x in (d, ud))
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert [(p["id"], p["status"], p["first_divergence"], p["diagnosis"]) for p in got["prompts"]] == [
        (p["id"], p["status"], p["first_divergence"], p["diagnosis"]) for p in want["prompts"]
    ]
    assert got["rescored_by"] == want["rescored_by"] == "hf bundled:tiny-llama", "bf16 flips near-ties here"

    # Stopped after both arms finished, before the report: no arm runs again, and the
    # reference is loaded only to re-score what diverged.
    (d / "report.json").unlink()
    r = subprocess.run(cli("gate", "--resume", str(d)), cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "candidate kept 16, generated 0; reference kept 16, generated 0" in r.stderr, r.stderr
    again = json.loads((d / "report.json").read_text())
    assert [p["diagnosis"] for p in again["prompts"]] == [p["diagnosis"] for p in want["prompts"]]
    print(f"kept {kept}/16 candidate prompts, generated {16 - kept} + 16 reference; resume took {resume_s:.1f} s; "
          f"verdict {got['verdict']}, {got['summary']['prompts_exact']}/16 exact")
