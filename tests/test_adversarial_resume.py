"""Hostile report directories and engines against `gate --resume` and `run` (issue 16 items
1, 6, 7, 8, 10, 16, 23): each test reproduces its item as found on main.

Real parts throughout: command engines are Python scripts under tests/engines/ run as real
child processes; the SIGKILL, SIGINT and lock tests drive a real `strict-gate gate` process.
The offline tests replay stored runs (the `recorded` engine, no torch); the hf one needs
transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import rec, write_gate, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.runs.prompts import load_prompts

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SLOW = ROOT / "tests" / "engines" / "slow_engine.py"
SPEED = ROOT / "tests" / "engines" / "speed_engine.py"
NOT_GREEDY = ROOT / "tests" / "engines" / "check_not_greedy.py"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
SAME = ("verdict", "policy", "band", "reasons", "summary", "prompt_set", "sampling", "problems")


@pytest.fixture(autouse=True)
def _reap(tmp_path):
    """Engines a failing test left running (their pidfiles) are killed afterwards."""
    yield
    for pidfile in tmp_path.glob("*.pid"):
        for pid in map(int, pidfile.read_text().split()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def report_dir(out: Path) -> Path:
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    return d


def resume(d: Path):
    return runner.invoke(app, ["gate", "--resume", str(d)])


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=120)


def report(d: Path) -> dict:
    return json.loads((d / "report.json").read_text())


# ---------------------------------------------------------------- offline gates (stored runs)


def offline_gate(tmp_path: Path, name: str = "offline", n: int = 6) -> Path:
    """n prompts; the candidate diverges on p4: a failing gate (exit 1)."""
    where = tmp_path / name
    where.mkdir()
    prompts = where / "set.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, i]}) + "\n" for i in range(n)))
    sha = load_prompts(prompts).sha256
    ref = [rec(f"p{i}", [10 + i, 20, 30], prompt=(1, 2, i)) for i in range(n)]
    cand = list(ref)
    cand[4] = rec("p4", [14, 99, 30], prompt=(1, 2, 4))
    write_run(where / "ref", ref, sha=sha, max_tokens=3, model="tiny")
    write_run(where / "cand", cand, sha=sha, max_tokens=3, model="tiny")
    return write_gate(where, name=name, prompts="set.jsonl", max_tokens=3, policy="strict",
                      output_dir=where / "reports", reference={"kind": "recorded", "path": "ref", "model": "tiny"},
                      candidate={"kind": "recorded", "path": "cand"})


def interrupted(config: Path, arm: str = "candidate", after: int = 2) -> Path:
    """Run the gate and Ctrl-C it once `arm` has written `after` records; the report dir."""

    def progress(label, total):
        seen = []

        def on_record(record, seconds):
            seen.append(record.id)
            if label == arm and len(seen) == after:
                raise KeyboardInterrupt

        return on_record

    with pytest.raises(KeyboardInterrupt):
        run_gate(load_gate_config(config), progress=progress)
    return report_dir(config.parent / "reports")


def test_item7_state_and_config_copied_from_another_gate_are_refused(tmp_path):
    a = interrupted(offline_gate(tmp_path, "alpha"))
    b = interrupted(offline_gate(tmp_path, "beta"))
    for f in ("gate.toml", "gate-state.json"):
        shutil.copy(b / f, a / f)
    r = resume(a)
    assert r.exit_code == 2, r.output  # was: resumed under beta's name
    assert "does not match the gate's seal" in r.output and "records.jsonl:1:" in r.output.replace("\n", "")
    assert not (a / "report.json").exists()


def test_item7_policy_edited_in_gate_state_is_refused(tmp_path):
    d = interrupted(offline_gate(tmp_path))
    state = json.loads((d / "gate-state.json").read_text())
    assert state["policy"] == "strict"
    state["policy"] = "distributional"
    (d / "gate-state.json").write_text(json.dumps(state))
    r = resume(d)
    assert r.exit_code == 2 and "the gate state was edited" in r.output.replace("\n", " "), r.output


def test_item7_a_reference_record_copied_into_the_candidate_is_refused(tmp_path):
    config = offline_gate(tmp_path)
    assert runner.invoke(app, ["gate", str(config)]).exit_code == 1
    d = report_dir(config.parent / "reports")
    ref_lines = (d / "reference" / "records.jsonl").read_text().splitlines(keepends=True)
    cand = d / "candidate" / "records.jsonl"
    lines = cand.read_text().splitlines(keepends=True)
    assert json.loads(lines[4])["id"] == "p4"
    lines[4] = ref_lines[4]
    cand.write_text("".join(lines))
    r = resume(d)
    assert r.exit_code == 2, r.output  # was: PASS, exit 0
    assert f"{cand}:5:" in r.output.replace("\n", "") and "seal" in r.output


def test_item6_runs_declaring_three_prompts_holding_two_are_incomplete(tmp_path):
    ref = [rec("p0", [10, 20], prompt=(1, 0)), rec("p1", [11, 20], prompt=(1, 1))]
    for name in ("a", "b"):
        write_run(tmp_path / name, ref, max_tokens=2)
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        m["prompt_set"] = {"name": "hand", "sha256": "0" * 64, "count": 3}  # no ids
        (tmp_path / name / "manifest.json").write_text(json.dumps(m))
    r = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert r.exit_code == 3, r.output  # was: PASS, exit 0
    assert "declares 3 prompts and the runs hold 2" in r.output.replace("\n", " ")


# ---------------------------------------------------------------- item 1: every stored verdict


def speed_gate(tmp_path: Path, reference_flags: tuple[str, ...], bar: float, clock: Path) -> Path:
    """Both arms in virtual time (`clock`: the virtual_clock fixture's file), so that the speed
    verdict does not depend on the machine's load."""
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("\n".join((ROOT / "prompts" / "smoke.jsonl").read_text().splitlines()[:2]) + "\n")

    def arm(*flags):
        return {"kind": "command", "command": [sys.executable, str(SPEED), "--per-token", "0.01", *flags,
                                               "--clock", str(clock)], "tokenizer": "bundled:tiny-llama"}

    return write_gate(tmp_path, name="speed", prompts=prompts, max_tokens=4, output_dir=tmp_path / "out",
                      policy="strict", reference=arm(*reference_flags), candidate=arm(),
                      speed={"warmup": 0, "runs": 4, "rungs": ["8/4"], "min_speed_ratio": {"decode": bar}})  # 4 runs: the fewest whose interval can separate from a bar


@pytest.mark.parametrize("flags, bar, code, said", [
    ((), 10.0, 4, "speed fail"),  # decode ~1x against a 10x bar
    (("--die-after", "2"), 0.5, 3, "speed incomplete"),  # the reference dies on its first timed request
])
def test_item1_resume_of_a_finished_gate_exits_with_its_speed_verdict(tmp_path, flags, bar, code, said,
                                                                      virtual_clock):
    config = speed_gate(tmp_path, flags, bar, virtual_clock)
    first = runner.invoke(app, ["gate", str(config)])
    assert first.exit_code == code, first.output
    d = report_dir(tmp_path / "out")
    assert report(d)["verdict"] == "pass"  # the tokens pass; the speed verdict is the second one
    r = resume(d)
    assert r.exit_code == code, r.output  # was: PASS, exit 0
    assert "nothing to resume" in r.output and said in r.output.replace("\n", " ")


# ---------------------------------------------------------------- items 10: error replies


def slow_gate(tmp_path: Path, *flags: str, n: int = 6) -> Path:
    """A reference and a candidate of tests/engines/slow_engine.py; `flags` go to the candidate."""
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n" for i in range(n)))
    ref = [sys.executable, str(SLOW), "--pidfile", str(tmp_path / "engines.pid")]
    return write_gate(tmp_path, name="slow", prompts="p.jsonl", max_tokens=2, top_logprobs=2, output_dir=tmp_path / "r",
                      policy="strict", reference={"kind": "command", "command": ref},
                      candidate={"kind": "command", "command": [*ref, *flags]})


def test_item10_resume_generates_error_replies_again(tmp_path):
    flag = tmp_path / "errors-on"
    flag.touch()
    config = slow_gate(tmp_path, "--error-if", str(flag))
    first = runner.invoke(app, ["gate", str(config)])
    assert first.exit_code == 3, first.output  # every candidate prompt errored
    d = report_dir(tmp_path / "r")
    flag.unlink()  # the engine is well again
    r = resume(d)
    assert r.exit_code == 0, r.output  # was: "nothing to resume", exit 3
    assert "candidate kept 0, generated 6; reference kept 6, generated 0" in r.output
    assert report(d)["verdict"] == "pass" and report(d)["summary"]["prompts_exact"] == 6


def run_engine_toml(tmp_path: Path, command: list[str]) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(f"kind = \"command\"\ncommand = {json.dumps(command)}\n")
    return path


@pytest.mark.parametrize("case", ["errors", "not-greedy"])
def test_item10_run_with_errored_or_non_greedy_prompts_is_failed_exit_3(tmp_path, case):
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n" for i in range(3)))
    if case == "errors":
        (tmp_path / "on").touch()
        command = [sys.executable, str(SLOW), "--error-if", str(tmp_path / "on")]
    else:
        command = [sys.executable, str(NOT_GREEDY)]
    toml = run_engine_toml(tmp_path, command)
    r = runner.invoke(app, ["run", str(toml), "-p", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o"),
                            "--max-tokens", "4"])
    assert r.exit_code == 3, r.output  # was: complete, exit 0
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["status"] == "failed" and m["records"] == 3
    assert ("errored" if case == "errors" else "not greedy") in m["error"]


# ---------------------------------------------------------------- a real gate process


class Live:
    """A `strict-gate gate` subprocess over `config`, watched from outside."""

    def __init__(self, config: Path):
        self.config = config
        self.out = config.parent / "r"
        self.proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", str(config)],
                                     cwd=config.parent, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)

    def wait_for_records(self, n: int) -> Path:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = list(self.out.glob("*/candidate/records.jsonl.partial"))
            if found and found[0].read_text().count("\n") >= n:
                return found[0].parent.parent
            time.sleep(0.02)
        self.proc.kill()
        raise AssertionError("the candidate never got going: " + self.proc.communicate()[0][-2000:])

    def finish(self) -> tuple[int, str]:
        out = self.proc.communicate(timeout=60)[0]
        return self.proc.returncode, out


def test_item8_sigkilled_gate_resumes_to_the_uninterrupted_verdict(tmp_path):
    config = slow_gate(tmp_path, "--delay", "0.3", "--diverge", "p3")
    live = Live(config)
    d = live.wait_for_records(2)
    live.proc.send_signal(signal.SIGKILL)
    code, _ = live.finish()
    assert code == -signal.SIGKILL
    m = json.loads((d / "candidate" / "manifest.json").read_text())
    assert m["status"] == "running" and m["engine"]["versions"].get("adv") == "1"  # the hello, before record 1
    assert not (d / "report.json").exists()

    r = cli("gate", "--resume", str(d), cwd=tmp_path)  # was: refused, "adv None -> 1", the run marked failed
    u = cli("gate", str(config), "-o", str(tmp_path / "u"), cwd=tmp_path)
    assert r.returncode == u.returncode == 1, r.stderr + r.stdout
    assert "candidate kept " in r.stderr and "reference kept 0, generated 6" in r.stderr
    got, want = report(d), report(report_dir(tmp_path / "u"))
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert [p["status"] for p in got["prompts"]] == [p["status"] for p in want["prompts"]]


def test_item16_a_second_resume_at_once_is_refused_by_the_lock(tmp_path):
    live = Live(slow_gate(tmp_path, "--delay", "0.3"))
    d = live.wait_for_records(1)
    r = resume(d)  # this process, while the gate process holds gate.lock
    assert r.exit_code == 2, r.output
    assert "gate.lock is held" in r.output.replace("\n", " ") and "Traceback" not in r.output
    code, out = live.finish()
    assert code == 0, out  # the first gate was not disturbed
    assert report(d)["verdict"] == "pass"


def test_item23_ctrl_c_names_the_runs_marked_failed_and_the_resume_command(tmp_path):
    live = Live(slow_gate(tmp_path, "--delay", "0.3"))
    d = live.wait_for_records(1)
    live.proc.send_signal(signal.SIGINT)
    code, out = live.finish()
    assert code == 3, out
    flat = out.replace("\n", "")
    assert f"runs marked failed: {d / 'candidate'}" in flat, out
    assert f"continue with: strict-gate gate --resume {d}" in flat, out


# ---------------------------------------------------------------- item 7: the model files changed


def test_item7_resume_after_the_hf_weights_changed_is_refused(tmp_path):
    from conftest import need

    need("transformers")
    model = tmp_path / "model"
    shutil.copytree(ROOT / "strict_gate" / "models" / "tiny-llama", model)
    (tmp_path / "p.jsonl").write_text("".join((ROOT / "prompts" / "battery-128.jsonl").read_text()
                                              .splitlines(keepends=True)[:4]))
    config = write_gate(tmp_path, name="hf", prompts="p.jsonl", max_tokens=4, output_dir=tmp_path / "reports",
                        reference={"kind": "hf", "model": "bundled:tiny-llama", "dtype": "float32"},
                        candidate={"kind": "hf", "model": str(model), "dtype": "float32"})
    d = interrupted(config, after=2)
    before = json.loads((d / "candidate" / "manifest.json").read_text())["engine"]["options"]["model_digest"]
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one weight's last byte: same name, same size
    weights.write_bytes(bytes(data))
    r = resume(d)
    assert r.exit_code == 2, r.output  # was: accepted, old and new weights judged together
    flat = r.output.replace("\n", "")
    assert "the candidate arm's engine changed" in flat and f"model_digest {before} ->" in flat, r.output
