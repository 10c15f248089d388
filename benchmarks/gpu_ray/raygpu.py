"""The raygpu step's Python (benchmarks/gpu_ray/run.sh drives it; README.md beside): the prompt set and
the arms' configs, one command measured, and the check that writes the table.

    raygpu.py prepare DIR --n N --device cuda --address HOST:PORT --gpus1 1 --gpus2 0.5 [--threads 1]
    raygpu.py measure JSON -- CMD...     # CMD run; wall s, peak RSS (wait4: the driver and what it waited
                                         # for), exit code written to JSON; exits with CMD's code
    raygpu.py check DIR --table OUT.md   # records equal? compare/gate verdicts, executor.json: the table
    raygpu.py stop TEMP_DIR              # SIGKILL every process whose command line names TEMP_DIR (the
                                         # cluster's --temp-dir), and their children: this cluster only,
                                         # by pid (`ray stop --force` stops every Ray process of the machine)

The arms (all `hf`, bundled:tiny-llama, float32, on --device): `inproc` the engine in the driver's
process; `ray1` one Ray actor asking --gpus1 GPUs; `ray2` two actors asking --gpus2 each (0.5: two
actors share the one GPU). The prompts: the first N of prompts/pool-2k.jsonl (2,295 text prompts),
cycled with an `-rK` id suffix past its end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("inproc", "ray1", "ray2")
LABEL = {"inproc": "(a) in-process, no Ray", "ray1": "(b) Ray, 1 actor, num_gpus 1",
         "ray2": "(c) Ray, 2 actors, num_gpus 0.5 each (one GPU shared)"}
CPU_LABEL = {**LABEL, "ray1": "(b) Ray, 1 actor, num_gpus 0", "ray2": "(c) Ray, 2 actors, num_gpus 0"}


def prepare(a: argparse.Namespace) -> None:
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    pool = [json.loads(x) for x in (ROOT / "prompts" / "pool-2k.jsonl").read_text().splitlines() if x.strip()]
    rows = []
    for i in range(a.n):
        p = pool[i % len(pool)]
        rows.append({"id": p["id"] + (f"-r{i // len(pool)}" if i >= len(pool) else ""), "text": p["text"]})
    (d / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = (ROOT / "strict_gate" / "models" / "tiny-llama").as_posix()  # an absolute path: every actor finds it
    engine = f'kind = "hf"\nmodel = "{model}"\ndtype = "float32"\ndevice = "{a.device}"\n'
    if a.threads:
        engine += f"threads = {a.threads}\n"  # on CPU: the same torch threads in the driver and the actors
    (d / "inproc.toml").write_text(engine)
    for arm, actors, gpus in (("ray1", 1, a.gpus1), ("ray2", 2, a.gpus2)):
        (d / f"{arm}.toml").write_text(engine + f'\n[ray]\naddress = "{a.address}"\nactors = {actors}\n'
                                       f"num_cpus = 1\nnum_gpus = {gpus}\nretries = 0\nstart_timeout_s = 300\n")
    for arm in ("ray1", "ray2"):  # a gate whose arms are both recorded runs: the in-process run and a pooled one
        (d / f"gate-{arm}.toml").write_text(
            f'name = "raygpu-{arm}-vs-inproc"\nprompts = "prompts.jsonl"\nmax_tokens = {a.max_tokens}\n'
            f'top_logprobs = {a.top_logprobs}\npolicy = "strict"\nband = 0.5\noutput_dir = "reports"\n\n'
            f'[reference]\nkind = "recorded"\npath = "{a.runs}/inproc"\nmodel = "{model}"\n\n'
            f'[candidate]\nkind = "recorded"\npath = "{a.runs}/{arm}"\nmodel = "{model}"\n')
    print(f"prepared {a.n} prompts, arms {', '.join(ARMS)} in {d} (device {a.device}, ray at {a.address})")


def measure(a: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    proc = subprocess.Popen(a.cmd)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except KeyboardInterrupt:
        proc.kill()
        raise
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    Path(a.json).write_text(json.dumps({"cmd": a.cmd, "rc": rc, "wall_s": round(wall, 3),
                                        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}) + "\n")
    return rc


def _records(run: Path) -> list[dict]:
    """Every field of every record but its timing, in file order."""
    name = "records.jsonl" if (run / "records.jsonl").exists() else "records.jsonl.partial"
    if not (run / name).exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if k != "timing"}
            for line in (run / name).read_text().splitlines() if line.strip()]


def _digest(records: list[dict]) -> str:
    return hashlib.sha256("".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()).hexdigest()[:16]


def _verdict(reports: Path, name: str) -> str:
    found = sorted([*reports.glob("report.json"), *reports.glob(f"{name}*/report.json")]) if reports.exists() else []
    if not found:
        return "-"
    return str(json.loads(found[-1].read_text()).get("verdict"))


def check(a: argparse.Namespace) -> int:
    d, runs = Path(a.dir), Path(a.runs)
    n = sum(1 for x in (d / "prompts.jsonl").read_text().splitlines() if x.strip())
    want = _records(runs / "inproc")
    lines = [f"# raygpu: {n} prompts, max_tokens {a.max_tokens}, top_logprobs {a.top_logprobs}, hf bundled:tiny-llama "
             f"float32 on {a.device}", "",
             "| arm | wall s | prompts/s | driver peak RSS MiB | rc | records | equal to (a) | records sha256/16 | "
             "compare (a) vs this | gate (a) vs this | actors: node / gpu_ids / CUDA_VISIBLE_DEVICES / prompts served |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ok = bool(want) and len(want) == n
    for arm in ARMS:
        mj = runs / f"{arm}.measure.json"
        m = json.loads(mj.read_text()) if mj.exists() else {}
        got = _records(runs / arm)
        equal = bool(got) and got == want
        if arm != "inproc":
            ok = ok and equal
        actors = "-"
        ex_path = runs / arm / "executor.json"
        if ex_path.exists():
            ex = json.loads(ex_path.read_text())
            served: dict[int, int] = {}
            for actor in ex["served"].values():
                served[actor] = served.get(actor, 0) + 1
            actors = "; ".join(f"#{x['index']} {x['node'][:8]} / {x.get('gpu_ids')} / {x.get('cuda_visible_devices')!r} / "
                               f"{served.get(x['index'], 0)}" for x in ex["actors"])
        wall = m.get("wall_s")
        rate = f"{len(got) / wall:.1f}" if wall and got else "-"
        cmp_v = "-" if arm == "inproc" else _verdict(runs / "compare" / arm, "")
        gate_v = "-" if arm == "inproc" else _verdict(runs / "reports", f"raygpu-{arm}-vs-inproc")
        if arm != "inproc":
            ok = ok and cmp_v == "pass"
        lines.append(f"| {(LABEL if a.device != 'cpu' else CPU_LABEL)[arm]} | {wall if wall is not None else '-'} | {rate} | {m.get('peak_rss_mib', '-')} | "
                     f"{m.get('rc', '-')} | {len(got)}/{n} | {'-' if arm == 'inproc' else ('yes' if equal else 'NO')} | "
                     f"{_digest(got) if got else '-'} | {cmp_v} | {gate_v} | {actors} |")
    lines += ["", f"All pooled runs equal to the in-process run and compared pass: {'YES' if ok else 'NO'}", "",
              "wall s: the whole `strict-gate run` (Python start, engine or actors started, every prompt, the run "
              "sealed); driver peak RSS: its ru_maxrss (os.wait4), the actors' memory not counted. Records compared "
              "field by field, timing left out (benchmarks/ray_pool.py's `_records`)."]
    Path(a.table).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def stop(a: argparse.Namespace) -> int:
    """The cluster started with --temp-dir TEMP_DIR, and only it: its processes found by their command
    lines (gcs_server, raylet, the agents and workers all name the session directory under it)."""
    mine, ancestors = os.getpid(), set()  # this command and what runs it (timeout) name TEMP_DIR too
    p = mine
    while p > 1:
        ancestors.add(p)
        try:
            p = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    roots = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in ancestors:
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if a.temp_dir in cmd:
                roots.append(int(d.name))
    kids, todo, seen = _children(), list(roots), set()
    while todo:
        p = todo.pop()
        if p not in seen and p not in ancestors:
            seen.add(p)
            todo += kids.get(p, [])
    for p in sorted(seen):
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass
    print(f"stopped {len(seen)} process(es) of the cluster under {a.temp_dir}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--device", default="cuda")
    p.add_argument("--address", required=True)
    p.add_argument("--gpus1", default="1")
    p.add_argument("--gpus2", default="0.5")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--runs", required=True)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--top-logprobs", type=int, default=5)
    m = sub.add_parser("measure")
    m.add_argument("json")
    m.add_argument("cmd", nargs=argparse.REMAINDER)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--runs", required=True)
    c.add_argument("--table", required=True)
    c.add_argument("--device", default="cuda")
    c.add_argument("--max-tokens", type=int, default=32)
    c.add_argument("--top-logprobs", type=int, default=5)
    st = sub.add_parser("stop")
    st.add_argument("temp_dir")
    a = ap.parse_args()
    if a.what == "stop":
        return stop(a)
    if a.what == "prepare":
        prepare(a)
        return 0
    if a.what == "measure":
        a.cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        return measure(a)
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
