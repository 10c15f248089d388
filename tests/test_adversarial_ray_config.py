"""Hostile `[<role>.ray]` tables (docs/scale-out.md, section 4): each is refused when the config is
read, exit 2 naming the gate file and the line, before any engine or cluster is touched; an
address where no cluster answers fails the arm (exit 3) within start_timeout_s, never a hang.
(A cluster without the GPUs a table asks for: tests/test_ray_executor.py, on its real cluster.)

Run from a working directory with relative paths, on the tests' real command engine and fake
OpenAI server (tests/engines/)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from strict_gate.cli import app

ENGINES = Path(__file__).resolve().parent / "engines"

COMMAND = '[candidate]\nkind = "command"\ncommand = ["python", "engine.py"]\nmodel = "slow-model"\n'
RECORDED_REF = '[reference]\nkind = "recorded"\npath = "one"\n'


def _gate(tmp_path: Path, monkeypatch, arms: str) -> str:
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINES / "slow_engine.py", "engine.py")
    Path("p.jsonl").write_text(json.dumps({"id": "p0", "token_ids": [1, 2, 3]}) + "\n")
    Path("g.toml").write_text('name = "ray-hostile"\nprompts = "p.jsonl"\nmax_tokens = 4\noutput_dir = "reports"\n'
                              + arms)
    return "g.toml"


def _line(text: str, header: str) -> int:
    return text.splitlines().index(header) + 1


def _refused(gate: str, header: str, *words: str) -> str:
    r = CliRunner().invoke(app, ["gate", gate])
    out = r.output
    assert r.exit_code == 2, out
    assert f"{gate}:{_line(Path(gate).read_text(), header)}" in out or any(
        f"{gate}:{i}" in out for i in _key_lines(gate, header)), out
    for w in words:
        assert w in out, out
    assert "Traceback" not in out and not Path("reports").exists(), out  # refused before anything was written
    return out


def _key_lines(gate: str, header: str) -> list[int]:
    """The lines of the table under `header` (a key's own line is as good as the header's)."""
    lines = Path(gate).read_text().splitlines()
    start = lines.index(header)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    return list(range(start + 1, end + 1))


def test_a_connect_mode_openai_arm_with_a_ray_table_is_refused_naming_the_ray_table(tmp_path, monkeypatch):
    gate = _gate(tmp_path, monkeypatch, RECORDED_REF + '[candidate]\nkind = "openai"\n'
                 'base_url = "http://127.0.0.1:9"\n[candidate.ray]\nactors = 2\n')
    out = _refused(gate, "[candidate.ray]", "connect mode is not pooled", "base_url = [")
    assert f"{gate}:{_line(Path(gate).read_text(), '[candidate.ray]')}" in out, out  # the table's own line


def test_a_connect_mode_list_of_servers_with_a_ray_table_is_refused(tmp_path, monkeypatch):
    gate = _gate(tmp_path, monkeypatch, RECORDED_REF + '[candidate]\nkind = "openai"\n'
                 'base_url = ["http://127.0.0.1:9", "http://127.0.0.1:10"]\n[candidate.ray]\nactors = 2\n')
    _refused(gate, "[candidate.ray]", "connect mode is not pooled")


def test_a_recorded_arm_with_a_ray_table_is_refused(tmp_path, monkeypatch):
    gate = _gate(tmp_path, monkeypatch, RECORDED_REF + "[reference.ray]\nactors = 2\n" + COMMAND)
    _refused(gate, "[reference.ray]", "stored run", "nothing to pool")


@pytest.mark.parametrize(("table", "words"), [
    ("actors = -1", ("actors",)),
    ("actors = 0", ("actors",)),
    ("retries = -1", ("retries",)),
    ("num_cpus = -0.5", ("num_cpus",)),
    ("num_gpus = -1", ("num_gpus",)),
    ("start_timeout_s = 0", ("start_timeout_s",)),
    ("actor = 2", ("actor", "did you mean 'actors'")),
    ('actors = "two"', ("actors",)),
    ("resources = 3", ("resources",)),
])
def test_a_hostile_ray_table_is_refused_naming_its_line(tmp_path, monkeypatch, table, words):
    gate = _gate(tmp_path, monkeypatch, RECORDED_REF + COMMAND + f"[candidate.ray]\n{table}\n")
    _refused(gate, "[candidate.ray]", *words)


def test_a_ray_key_that_is_not_a_table_is_refused(tmp_path, monkeypatch):
    gate = _gate(tmp_path, monkeypatch, RECORDED_REF + COMMAND + "ray = 4\n")
    r = CliRunner().invoke(app, ["gate", gate])
    assert r.exit_code == 2 and f"{gate}:{_line(Path(gate).read_text(), 'ray = 4')}" in r.output, r.output
    assert "must be a table" in r.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pool(tmp_path: Path, monkeypatch, address: str) -> tuple[int, str, float]:
    """`strict-gate run` of a pooled command engine at `address`: exit code, output, seconds."""
    from conftest import need

    need("ray")
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINES / "slow_engine.py", "engine.py")
    Path("p.jsonl").write_text(json.dumps({"id": "p0", "token_ids": [1, 2, 3]}) + "\n")
    Path("pool.toml").write_text('kind = "command"\ncommand = ["python", "engine.py"]\nmodel = "slow-model"\n'
                                 f'[ray]\naddress = "{address}"\nstart_timeout_s = 4\n')
    t0 = time.monotonic()  # in a process of its own: a ray.init left hanging must not hold pytest
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "run", "pool.toml", "-p", "p.jsonl", "--out", "pool",
                        "--max-tokens", "2"], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def test_an_address_where_nothing_listens_fails_at_once_with_exit_3(tmp_path, monkeypatch):
    address = f"127.0.0.1:{_free_port()}"
    code, out, _ = _run_pool(tmp_path, monkeypatch, address)
    assert code == 3, out
    assert "does not answer" in out and address in out and "Traceback" not in out, out
    assert json.loads(Path("pool/manifest.json").read_text())["status"] == "failed"  # never a complete run


def test_an_address_that_accepts_but_never_answers_fails_within_start_timeout(tmp_path, monkeypatch):
    """A port that takes the connection and says nothing (not a Ray cluster): ray.init alone
    retries for minutes; the arm fails after start_timeout_s (4 s here), exit 3."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        code, out, seconds = _run_pool(tmp_path, monkeypatch, f"127.0.0.1:{mute.getsockname()[1]}")
    assert code == 3, out
    assert "did not answer within start_timeout_s = 4 s" in out or "cannot connect" in out, out
    assert seconds < 60, seconds  # bounded by start_timeout_s, not ray.init's own minutes of retries
