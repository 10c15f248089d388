"""A secret the candidate needs ([candidate.env]) and a careless engine echoes everywhere it can
(its hello, its stderr, its error replies) never reaches a file under the output directory:
after a gate, after a gate interrupted by a real SIGINT or SIGKILL, after its `--resume`, and
after the commands that rewrite a report directory or write one of their own (diagnose,
localize, invariance, bench, nightly) (issue 40, item 1).

Was: `gate --resume` re-read the report's gate.toml, where the entry reads "<redacted>", so the
value the engine inherited from the environment was not known to the redaction: the resume
refused, quoting the secret on the console and into candidate/manifest.json ("the engine
changed: MY_API_TOKEN <redacted> -> VALUE"), or wrote it into report.json, report.md,
candidate/manifest.json and candidate/engine.log; a SIGKILLed gate left it in engine.log, copied
from the engine's stderr as it came.

Real parts only: every engine is tests/engines/config_engine.py, a real child process speaking
the command protocol; every gate is a real `strict-gate` process run from its working directory
with relative paths, and signalled from outside.
"""

from __future__ import annotations

import json
import os
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bisect_repo import BUILD, FLIPPED, GOOD, commit, git
from bisect_repo import gate_config as make_gate
from helpers import write_gate
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
ENGINE = str(ROOT / "tests" / "engines" / "config_engine.py")
ENV = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
PLACES = ("stderr", "hello", "error")
SECRET = st.text(string.ascii_letters + string.digits + "-_.:/+=~@%", min_size=8, max_size=40).map(lambda s: "sg+" + s)
NAMES = st.sampled_from(["MY_API_TOKEN", "HF_TOKEN", "DB_PASSWORD", "X_AUTH_HEADER", "cloud_secret_key"])
WHERE = st.sets(st.sampled_from(PLACES), min_size=1).map(lambda s: ",".join(sorted(s)))


def _pids(work: Path) -> list[int]:
    path = work / "engines.pid"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.fixture(autouse=True)
def _reap(tmp_path):
    """Engines a killed gate or a failing test left running are killed afterwards."""
    yield
    for pidfile in tmp_path.rglob("engines.pid"):
        for pid in map(int, pidfile.read_text().split()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def config(work: Path, name: str, secret: str, places: str, *flags: str, **tables) -> Path:
    """6 prompts; the candidate needs `name` = secret, echoes it at `places` and errors on p5."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "p.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "token_ids": [1, 5 + i, 9]}) + "\n" for i in range(6)))
    engine = [sys.executable, ENGINE, "--pidfile", "engines.pid"]
    candidate = {"kind": "command", "command": [*engine, "--echo", name, "--places", places, "--error-id", "p5",
                                                *flags], "env": {name: secret}}
    return write_gate(work, name="secret", prompts="p.jsonl", max_tokens=3, top_logprobs=2, policy="strict",
                      output_dir="r", reference={"kind": "command", "command": engine}, candidate=candidate, **tables)


def cli(work: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], cwd=work, env=env or ENV,
                          capture_output=True, text=True, timeout=180)


def assert_nowhere(secret: str, work: Path, *consoles: str, when: str) -> None:
    """Not in any file under the output directory, nor on a console."""
    files = [f for f in (work / "r").rglob("*") if f.is_file()]
    assert files, when
    leaks = [str(f.relative_to(work)) for f in files if secret.encode() in f.read_bytes()]
    assert leaks == [], f"{when}: the secret is in {leaks}"
    assert not [c for c in consoles if secret in c], f"{when}: the secret is on the console"


def report_dir(work: Path) -> Path:
    (d,) = [p for p in (work / "r").iterdir() if p.is_dir()]
    return d


def interrupt(work: Path, sig: int) -> tuple[Path, str]:
    """Start `strict-gate gate gate.toml` and send it `sig` once the candidate has written two records."""
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", "gate.toml"], cwd=work, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((work / "r").glob("*/candidate/records.jsonl.partial"))
        if found and found[0].read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == (3 if sig == signal.SIGINT else -sig), out
    if sig == signal.SIGKILL:  # its engine outlives it until its watchdog notices: gone before the resume
        deadline = time.monotonic() + 15
        while any(Path(f"/proc/{p}").exists() for p in _pids(work)) and time.monotonic() < deadline:
            time.sleep(0.05)
    return report_dir(work), out


@settings(max_examples=2, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # no shrinking: each example is ~10 s
@given(secret=SECRET, name=NAMES, places=WHERE, sig=st.sampled_from([signal.SIGINT, signal.SIGKILL]))
@example(secret="sg+hf_0123456789abcdef", name="MY_API_TOKEN", places="error,hello,stderr", sig=signal.SIGKILL)
@example(secret="sg+hf_0123456789abcdef", name="MY_API_TOKEN", places="error,hello,stderr", sig=signal.SIGINT)
def test_a_planted_secret_reaches_no_file_after_a_gate_an_interrupt_and_a_resume(tmp_path_factory, monkeypatch,
                                                                                 secret, name, places, sig):
    work = tmp_path_factory.mktemp("w")
    monkeypatch.chdir(work)
    config(work, name, secret, places, "--delay", "0.3")
    first = cli(work, "gate", "gate.toml", "-o", "r/whole")
    assert first.returncode == 3, first.stdout + first.stderr  # p5 errors: incomplete, never a pass
    assert_nowhere(secret, work, first.stdout, first.stderr, when="after a whole gate")
    (work / "r" / "whole").rename(work / "whole")  # the next gate writes r/ afresh
    d, said = interrupt(work, sig)
    assert_nowhere(secret, work, said, when=f"after {signal.Signals(sig).name}")
    resumed = cli(work, "gate", "--resume", str(d.relative_to(work)), env=ENV | {name: secret})  # the user exports it
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr  # was: 2, "the engine changed: ... -> VALUE"
    assert "candidate kept 2" in resumed.stderr, resumed.stderr
    assert_nowhere(secret, work, resumed.stdout, resumed.stderr, when=f"after {signal.Signals(sig).name} and --resume")
    report = json.loads((d / "report.json").read_text())
    assert report["engines"]["candidate"]["env"] == {name: "<redacted>"}
    echoed = {"stderr": (d / "candidate" / "engine.log").read_text(),  # what it echoed is there, scrubbed
              "hello": json.dumps(report["engines"]["candidate"]["versions"]),
              "error": json.dumps([p["reason"] for p in report["prompts"] if p["id"] == "p5"])}
    assert all(f"{name}=<redacted>" in echoed[p] or f'"{name}": "<redacted>"' in echoed[p]
               or f"'{name}': '<redacted>'" in echoed[p] for p in places.split(",")), echoed


def test_the_commands_after_a_gate_write_no_planted_secret(tmp_path, monkeypatch):
    """diagnose, localize, invariance, bench and nightly on a gate whose candidate diverges on p2."""
    secret, name = "sg+" + os.urandom(12).hex(), "MY_API_TOKEN"
    monkeypatch.chdir(tmp_path)
    config(tmp_path, name, secret, ",".join(PLACES), "--diverge", "p2",
           invariance={"batch": [2], "policy": "strict"}, speed={"warmup": 0, "runs": 1, "rungs": ["gate"]})
    gate = cli(tmp_path, "gate", "gate.toml")
    assert gate.returncode == 1, gate.stdout + gate.stderr  # p2 diverges
    d = str(report_dir(tmp_path).relative_to(tmp_path))
    consoles = [gate.stdout, gate.stderr]
    for args in (("diagnose", d), ("localize", d), ("invariance", "gate.toml"), ("bench", "gate.toml"),
                 ("nightly", "gate.toml")):
        p = cli(tmp_path, *args, env=ENV | {name: secret})
        assert p.returncode in (0, 1, 3, 5), (args, p.stdout + p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
        consoles += [p.stdout, p.stderr]
        assert_nowhere(secret, tmp_path, *consoles, when=f"after {' '.join(args)}")


LEAKY = GOOD.replace('    base = req["prompt_token_ids"][-1]\n',
                     '    print("not json: token " + os.environ["MY_API_TOKEN"], flush=True)\n'
                     '    base = req["prompt_token_ids"][-1]\n').replace("import json\n", "import json\nimport os\n")


def test_bisect_writes_no_planted_secret(tmp_path, monkeypatch):
    """Commit 2's engine answers a request with a line that is not JSON, quoting the secret: the
    gate fails on it (an arm failure), the step is skipped with that message. Neither steps.jsonl,
    bisect.json nor any step's report holds it. Was: both quoted it ("malformed JSON line ...")."""
    secret = "sg+" + os.urandom(12).hex()
    monkeypatch.chdir(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    good = commit(repo, "1: the engine", **{"engine.py": GOOD})
    commit(repo, "2: it logs its token", **{"engine.py": LEAKY})
    bad = commit(repo, "3: a faster third token", **{"engine.py": FLIPPED})
    text = make_gate(tmp_path, repo).read_text().replace(f'"{tmp_path / "reports"}"', '"r"')
    (tmp_path / "gate.toml").write_text(text + f'[candidate.env]\nMY_API_TOKEN = "{secret}"\n')
    p = cli(tmp_path, "bisect", "gate.toml", "--repo", "repo", "--good", good, "--bad", bad, "--build", BUILD)
    assert p.returncode == 3, p.stdout + p.stderr  # commit 2 skipped: 2 or 3 is the first bad one, left open
    (out,) = (tmp_path / "r").glob("*-bisect-*/bisect.json")
    steps = json.loads(out.read_text())["steps"]
    assert any("malformed JSON line" in s["message"] and "<redacted>" in s["message"] for s in steps), steps
    assert_nowhere(secret, tmp_path, p.stdout, p.stderr, when="after bisect")


def test_a_secret_cut_in_two_by_the_pipe_is_scrubbed_whole_on_its_way_into_engine_log(tmp_path):
    """An engine writes its token to stderr in two halves, 50 ms apart (two reads of the pipe): the
    log pump holds the unfinished line and scrubs it whole. Was: the pump copied raw bytes (the
    gate's last pass over the directory scrubbed them, which a SIGKILLed gate never runs)."""
    from strict_gate.core.redact import register
    from strict_gate.engines.process import close_log, open_log, spawn, stop_group

    secret = "sg+" + os.urandom(12).hex()
    register(secret)
    half = len(secret) // 2
    child = (f"import sys, time; sys.stderr.write({secret[:half]!r}); sys.stderr.flush(); time.sleep(0.05); "
             f"sys.stderr.write({secret[half:]!r} + ' and more\\n'); sys.stderr.flush(); time.sleep(0.3)")
    log, path, _ = open_log(tmp_path / "engine.log", "t-", "--- start")
    proc = spawn([sys.executable, "-c", child], {}, str(tmp_path), stderr=log)
    proc.wait(timeout=30)
    stop_group(proc, proc.pid, 1.0, 5.0)
    close_log(log)
    text = Path(path).read_text()
    assert secret not in text and "<redacted> and more" in text, text
