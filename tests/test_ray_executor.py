"""An arm served by Ray actors (docs/scale-out.md, section 4) on a real local Ray cluster: a head
and a second node on 127.0.0.1 (`ray start`, one CPU each), stopped after. Command engines
(tests/engines/slow_engine.py): records equal the single-process run's in tokens and logprobs;
a worker node SIGKILLed mid-run and the run still complete and equal; the driver SIGKILLed,
then `gate --resume`. Run from a working directory with relative paths, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENGINE = Path(__file__).parent / "engines" / "slow_engine.py"
RAY = str(Path(sys.executable).with_name("ray"))
N = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], env: dict[str, str]) -> None:
    out = subprocess.run([RAY, "start", *args, "--disable-usage-stats"], capture_output=True, text=True, timeout=180,
                         env=env)
    assert out.returncode == 0, out.stdout + out.stderr


def _tree(pid: int) -> list[int]:
    """pid and every descendant, from /proc."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _raylet(port: int) -> int:
    """The raylet of the node started with --node-manager-port `port`."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "raylet" in cmd.split(" ")[0] and f"--node_manager_port={port}" in cmd:
                return int(d.name)
    raise AssertionError(f"no raylet on port {port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import need

    need("ray")  # CI installs the [ray] extra (scripts/install.sh): there it fails, never skips
    """(address, env, start a second node -> its node-manager port). The head has one CPU and
    serves one actor; each second node one more."""
    tmp = tmp_path_factory.mktemp("ray")
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    port = _free_port()
    _start(["--head", "--num-cpus", "1", "--port", str(port), "--temp-dir", str(tmp / "t"),
            "--include-dashboard=false", "--node-ip-address", "127.0.0.1"], env)
    address = f"127.0.0.1:{port}"

    ports: list[int] = []

    def node() -> tuple[int, int]:
        """One more node: its node-manager port, and the CPUs the cluster has now (one per node)."""
        nm = _free_port()
        _start(["--address", address, "--num-cpus", "1", "--node-manager-port", str(nm),
                "--node-ip-address", "127.0.0.1"], env)
        ports.append(nm)
        return nm, len(ports) + 1

    try:
        yield address, env, node
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)


def _workdir(where: Path, address: str, *, actors: int, delay: float) -> None:
    shutil.copy(ENGINE, where / "engine.py")
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, i + 3]}) + "\n"
                                           for i in range(N)))
    engine = f'kind = "command"\ncommand = ["python", "engine.py", "--delay", "{delay}"]\nmodel = "slow-model"\n'
    (where / "one.toml").write_text(engine)
    (where / "pool.toml").write_text(engine + f'[ray]\naddress = "{address}"\nactors = {actors}\nretries = 2\n'
                                     'start_timeout_s = 60\n')


def _records(run: Path) -> list[dict]:
    name = "records.jsonl" if (run / "records.jsonl").exists() else "records.jsonl.partial"
    return [{k: v for k, v in json.loads(line).items() if k != "timing"}
            for line in (run / name).read_text().splitlines() if line.strip()]


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def test_a_pool_of_actors_on_two_nodes_writes_the_single_engines_records(cluster, tmp_path, monkeypatch):
    address, env, node = cluster
    node()
    monkeypatch.chdir(tmp_path)
    _workdir(tmp_path, address, actors=2, delay=0.0)
    for toml, out in (("one.toml", "one"), ("pool.toml", "pool")):
        r = cli("run", toml, "-p", "p.jsonl", "--out", out, "--max-tokens", "4", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    assert _records(Path("pool")) == _records(Path("one"))  # in the set's order, byte for byte but timings
    ex = json.loads(Path("pool/executor.json").read_text())
    assert len(ex["actors"]) == 2 and len(ex["nodes"]) == 2, ex  # one actor per node: one CPU each
    # the GPUs Ray gave each actor: none asked (num_gpus = 0), none given; CUDA_VISIBLE_DEVICES as Ray left it
    assert all(a["gpu_ids"] == [] and "cuda_visible_devices" in a for a in ex["actors"]), ex
    assert sorted(ex["served"]) == sorted(f"p{i}" for i in range(N)) and set(ex["served"].values()) == {0, 1}
    manifest = json.loads(Path("pool/manifest.json").read_text())
    assert manifest["engine"]["options"]["executor"] == {"kind": "ray", "cluster": address, "actors": 2}


def test_a_node_killed_mid_run_leaves_a_complete_equal_run(cluster, tmp_path, monkeypatch):
    """The newest node's raylet and its workers SIGKILLed once 4 records are in. One actor per CPU
    of the cluster, so an actor runs there and no node has room for its replacement: its prompt
    goes to a live actor and the run completes, equal."""
    address, env, node = cluster
    port, cpus = node()
    monkeypatch.chdir(tmp_path)
    _workdir(tmp_path, address, actors=cpus, delay=0.25)
    r = cli("run", "one.toml", "-p", "p.jsonl", "--out", "one", "--max-tokens", "4", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "run", "pool.toml", "-p", "p.jsonl", "--out",
                             "pool", "--max-tokens", "4"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    partial = list(tmp_path.glob(".pool.tmp-*/records.jsonl.partial"))
    while time.monotonic() < deadline and not (partial and len(partial[0].read_text().splitlines()) >= 4):
        time.sleep(0.1)
        partial = list(tmp_path.glob(".pool.tmp-*/records.jsonl.partial"))
    assert partial, "the pooled run never wrote 4 records"
    for pid in _tree(_raylet(port)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert _records(Path("pool")) == _records(Path("one"))
    ex = json.loads(Path("pool/executor.json").read_text())
    assert ex["resent"], "a node died mid-run: at least one prompt was sent again"
    assert all(x["node"] != ex["actors"][0]["node"] or x["actor"] != 0 for x in ex["resent"])
    assert sorted(ex["served"]) == sorted(f"p{i}" for i in range(N))


def test_a_driver_sigkilled_mid_gate_continues_with_resume(cluster, tmp_path, monkeypatch):
    address, env, node = cluster
    node()
    monkeypatch.chdir(tmp_path)
    _workdir(tmp_path, address, actors=2, delay=0.25)
    r = cli("run", "one.toml", "-p", "p.jsonl", "--out", "one", "--max-tokens", "4", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    Path("g.toml").write_text('name = "ray-gate"\nprompts = "p.jsonl"\nmax_tokens = 4\ntop_logprobs = 5\n'
                              'policy = "strict"\noutput_dir = "reports"\n'
                              '[reference]\nkind = "recorded"\npath = "one"\nmodel = "slow-model"\n'
                              '[candidate]\nkind = "command"\ncommand = ["python", "engine.py", "--delay", "0.25"]\n'
                              f'model = "slow-model"\n[candidate.ray]\naddress = "{address}"\nactors = 2\n')
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", "g.toml"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    part: list[Path] = []
    while time.monotonic() < deadline and not (part and len(part[0].read_text().splitlines()) >= 5):
        time.sleep(0.1)
        part = list(Path("reports").glob("*/candidate/records.jsonl.partial"))
    assert part, "the gate's candidate never wrote 5 records"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    (report,) = [p for p in Path("reports").iterdir() if p.is_dir()]
    kept = len(_records(report / "candidate"))
    r = cli("gate", "--resume", str(report), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _records(report / "candidate") == _records(Path("one"))
    resumed = json.loads((report / "candidate" / "manifest.json").read_text())["resumed"]
    assert resumed and resumed[-1]["kept"] == kept and resumed[-1]["remaining"] == N - kept


SERVER = Path(__file__).parent / "engines" / "fake_openai_server.py"
CASCADE = Path(__file__).parent / "engines" / "cascade_engine.py"


def test_launched_openai_servers_run_in_the_actors_and_stop_with_them(cluster, tmp_path, monkeypatch):
    """A launched openai arm: each actor launches its own server (tests/engines/fake_openai_server.py,
    one per actor, each writing its pids to pids-PORT.txt); the records equal the single-process
    run's, and once the run is over no server (nor its child) is left running."""
    from helpers import pid_alive

    address, env, node = cluster
    node()
    monkeypatch.chdir(tmp_path)
    shutil.copy(SERVER, "server.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, i + 3]}) + "\n" for i in range(6)))
    arm = ('kind = "openai"\nserve = ["python", "server.py", "--port", "{port}", "--spawn-child", "--pidfile", '
           '"pids-{port}.txt"]\nstartup_timeout_s = 60\nstop_timeout_s = 20\n')
    Path("one.toml").write_text(arm)
    Path("pool.toml").write_text(arm + f'[ray]\naddress = "{address}"\nactors = 2\nstart_timeout_s = 120\n')
    r = cli("run", "one.toml", "-p", "p.jsonl", "--out", "one", "--max-tokens", "4", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    alone = set(Path(".").glob("pids-*.txt"))
    r = cli("run", "pool.toml", "-p", "p.jsonl", "--out", "pool", "--max-tokens", "4", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _records(Path("pool")) == _records(Path("one"))
    ex = json.loads(Path("pool/executor.json").read_text())
    assert len(ex["actors"]) == 2 and set(ex["served"].values()) == {0, 1}, ex
    pooled = set(Path(".").glob("pids-*.txt")) - alone
    assert len(pooled) == 2, pooled  # one server launched in each actor, none in the driver
    pids = [int(p) for f in pooled for p in f.read_text().split()]
    deadline = time.monotonic() + 5  # the actors' close stopped them; a watchdog would take stop_timeout_s (20 s)
    while time.monotonic() < deadline and any(map(pid_alive, pids)):
        time.sleep(0.2)
    assert not [p for p in pids if pid_alive(p)], "a launched server outlived its actor"
    logs = list(Path("pool").glob("engine-*.log"))
    assert len(logs) == 2 and all("fake server listening" in f.read_text() for f in logs), logs


def _cascade_gate(name: str, ray: str) -> str:
    """A gate whose candidate flips the near-tie at position 2 of every prompt (tests/engines/
    cascade_engine.py): every prompt is re-scored by the reference (served by `ray`, if any)."""
    Path(f"{name}.toml").write_text(
        f'name = "{name}"\nprompts = "p.jsonl"\nmax_tokens = 6\ntop_logprobs = 5\nband = 0.5\noutput_dir = "reports"\n'
        '[reference]\nkind = "command"\ncommand = ["python", "cascade_engine.py", "reference"]\n' + ray +
        '[candidate]\nkind = "command"\ncommand = ["python", "cascade_engine.py", "candidate", "--flip", "2"]\n')
    return f"{name}.toml"


def _verdict(report: Path) -> tuple:
    doc = json.loads((report / "report.json").read_text())
    return doc["verdict"], doc["summary"], [(p["id"], p["status"], p.get("outcome"), p.get("diagnosis"))
                                            for p in doc["prompts"]]


def test_flips_are_rescored_by_the_actors_in_turn_with_the_single_process_verdict(cluster, tmp_path, monkeypatch):
    address, env, node = cluster
    node()
    monkeypatch.chdir(tmp_path)
    shutil.copy(CASCADE, "cascade_engine.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [1, 2, i + 3]}) + "\n" for i in range(4)))
    codes = []
    for gate in (_cascade_gate("alone", ""), _cascade_gate("pooled", f'[reference.ray]\naddress = "{address}"\n'
                                                                      'actors = 2\nstart_timeout_s = 120\n')):
        r = cli("gate", gate, cwd=tmp_path, env=env)
        assert r.returncode in (0, 1), r.stdout + r.stderr
        codes.append(r.returncode)
    assert codes[0] == codes[1]
    (alone,) = Path("reports").glob("alone-*")
    (pooled,) = Path("reports").glob("pooled-*")
    assert _verdict(pooled) == _verdict(alone)
    diagnosed = [d for _, _, _, d in _verdict(alone)[2] if d]
    assert len(diagnosed) == 4, _verdict(alone)  # every prompt's flip was re-scored
    ex = json.loads((pooled / "reference" / "executor.json").read_text())
    assert sum(ex["scored"].values()) >= 4 and len(ex["scored"]) == 2, ex  # 4 flips, both actors scored


def test_a_table_asking_for_gpus_the_cluster_has_not_fails_within_start_timeout(cluster, tmp_path, monkeypatch):
    address, env, _ = cluster
    monkeypatch.chdir(tmp_path)
    _workdir(tmp_path, address, actors=1, delay=0.0)
    Path("gpu.toml").write_text(Path("pool.toml").read_text().replace("start_timeout_s = 60", "start_timeout_s = 3")
                                + "num_gpus = 1\n")
    t0 = time.monotonic()
    r = cli("run", "gpu.toml", "-p", "p.jsonl", "--out", "gpu", "--max-tokens", "4", cwd=tmp_path, env=env)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no room for them within start_timeout_s = 3 s" in r.stderr + r.stdout and "GPU 0 in all" in r.stderr + \
        r.stdout, r.stdout + r.stderr
    assert time.monotonic() - t0 < 90


def test_what_drives_one_engine_says_it_is_not_pooled(cluster, tmp_path, monkeypatch):
    """A Ray candidate with [invariance], [speed] and localize: its invariance variants run on one
    engine in the driver, each variant run's manifest saying so; the speed arm and localisation
    say why they did not run on the pool (report.json), never a stored-run or cannot-dump story."""
    address, env, _ = cluster
    monkeypatch.chdir(tmp_path)
    shutil.copy(Path(__file__).parent / "engines" / "variant_engine.py", "engine.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7]}) + "\n"
                                       for i in range(3)))
    Path("g.toml").write_text(
        'name = "said"\nprompts = "p.jsonl"\nmax_tokens = 4\ntop_logprobs = 2\noutput_dir = "reports"\nlocalize = true\n'
        '[reference]\nkind = "command"\ncommand = ["python", "engine.py", "--score"]\n'
        '[candidate]\nkind = "command"\ncommand = ["python", "engine.py", "--score", "--shift", "1"]\n'
        f'[candidate.ray]\naddress = "{address}"\nactors = 1\nstart_timeout_s = 120\n'
        '[invariance]\narms = ["candidate"]\nbatch = [2]\n[speed]\nwarmup = 0\nruns = 2\nrungs = ["4/4"]\n')
    r = cli("gate", "g.toml", cwd=tmp_path, env=env)
    assert r.returncode in (1, 3), r.stdout + r.stderr  # the candidate diverges everywhere
    (report,) = Path("reports").glob("said-*")
    manifests = list((report / "invariance" / "candidate").rglob("manifest.json"))
    assert manifests, r.stdout + r.stderr
    for m in manifests:
        executor = json.loads(m.read_text())["engine"]["options"]["executor"]
        assert executor == {"kind": "driver", "pooled": False, "note": "not pooled: ran in the driver process"}, m
    assert json.loads((report / "candidate" / "manifest.json").read_text())["engine"]["options"]["executor"][
        "kind"] == "ray"
    text = (report / "report.json").read_text()
    assert "served by a pool of Ray actors ([candidate.ray]): not timed (not pooled" in text, text
    assert "not localised: the candidate (command) is served by a pool of Ray actors" in text, text
    assert "stored run" not in text and "cannot dump" not in text
