"""An arm served by Ray actors against the in-process path: 10,000 prompts through a fast command
engine (tests/engines/slow_engine.py, no delay) on 1, 2 and 3 local Ray nodes (one CPU each, all
on 127.0.0.1 of this machine), then the same on 2 nodes with the second node SIGKILLed mid-run.

    .venv/bin/python benchmarks/ray_pool.py [--prompts 10000] [--out benchmarks/results/ray-pool.md]

Per row: wall time of `strict-gate run`, prompts/s, the driver's peak RSS, the overhead against
the in-process run, whether the records equal the in-process run's (every field but timings),
and how many prompts were sent again. Hardware-dependent: one machine stands in for the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_ray_executor import _free_port, _raylet, _records, _tree  # the tests' cluster helpers

RAY = str(Path(sys.executable).with_name("ray"))


def start(args: list[str], env: dict[str, str]) -> None:
    subprocess.run([RAY, "start", *args, "--disable-usage-stats"], check=True, capture_output=True, env=env)


def _rss_kib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def run(where: Path, toml: str, out: str, env: dict[str, str], kill_port: int | None = None) -> tuple[float, int]:
    """Wall seconds and the driver's peak RSS (KiB, its VmHWM read while it runs) of one `strict-gate run`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "run", toml, "-p", "p.jsonl", "--out", out,
                             "--max-tokens", "8"], cwd=where, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    peak, killed = 0, kill_port is None
    while proc.poll() is None:
        peak = max(peak, _rss_kib(proc.pid))
        partial = list(where.glob(f".{out}.tmp-*/records.jsonl.partial"))
        if not killed and partial and len(partial[0].read_text().splitlines()) >= 1000:
            for pid in _tree(_raylet(kill_port)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed = True
        time.sleep(0.1)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(err)
    return time.perf_counter() - t0, peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ray-pool.md"))
    a = ap.parse_args()
    where = Path(tempfile.mkdtemp(prefix="ray-pool-"))
    shutil.copy(ROOT / "tests" / "engines" / "slow_engine.py", where / "engine.py")
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, i % 5000 + 3]}) + "\n"
                                           for i in range(a.prompts)))
    engine = 'kind = "command"\ncommand = ["python", "engine.py"]\nmodel = "slow-model"\n'
    (where / "one.toml").write_text(engine)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    base_s, base_rss = run(where, "one.toml", "one", env)
    want = _records(where / "one")
    rows = [("in-process (no Ray)", 1, base_s, base_rss, True, 0)]
    for nodes, kill in ((1, False), (2, False), (3, False), (2, True)):
        port = _free_port()
        start(["--head", "--num-cpus", "1", "--port", str(port), "--temp-dir", str(where / "ray"),
               "--include-dashboard=false", "--node-ip-address", "127.0.0.1"], env)
        ports = []
        for _ in range(nodes - 1):
            ports.append(_free_port())
            start(["--address", f"127.0.0.1:{port}", "--num-cpus", "1", "--node-manager-port", str(ports[-1]),
                   "--node-ip-address", "127.0.0.1"], env)
        (where / "pool.toml").write_text(engine + f'[ray]\naddress = "127.0.0.1:{port}"\nactors = {nodes}\n')
        out = f"pool{nodes}{'k' if kill else ''}"
        try:
            s, rss = run(where, "pool.toml", out, env, kill_port=ports[-1] if kill else None)
        finally:
            subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env)
        resent = len(json.loads((where / out / "executor.json").read_text())["resent"])
        label = f"Ray, {nodes} node(s), {nodes} actor(s)" + (", node 2 SIGKILLed after 1,000 records" if kill else "")
        rows.append((label, nodes, s, rss, _records(where / out) == want, resent))
    lines = [f"# An arm served by Ray actors: {a.prompts:,} prompts, a fast command engine", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; every node on "
             "127.0.0.1 of this one machine, one CPU each (hardware-dependent).",
             f"Command: `.venv/bin/python benchmarks/ray_pool.py --prompts {a.prompts}`", "",
             "| path | nodes | wall s | prompts/s | driver peak RSS MiB | vs in-process | records equal | prompts sent again |",
             "|---|---|---|---|---|---|---|---|"]
    for label, nodes, s, rss, equal, resent in rows:
        lines.append(f"| {label} | {nodes} | {s:.1f} | {a.prompts / s:.0f} | {rss / 1024:.0f} | {s / base_s:.2f}x | "
                     f"{'yes' if equal else 'NO'} | {resent} |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
