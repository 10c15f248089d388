"""The acceptance run: every shipped gate run the way a user types it, checked against
benchmarks/acceptance.toml.

    bash scripts/acceptance.sh                    # the fast tier (CI runs it: .ci/run)
    bash scripts/acceptance.sh --tier full        # every gate and follow-up
    bash scripts/acceptance.sh --tier all         # and the real model's K = 5 re-captures (an hour each)
    bash scripts/acceptance.sh --only kda-recurrent,kda-recurrent-localize --rev 13043cc

It copies a commit of the repository (`git archive REV`, default HEAD) into a temporary
directory, links the installed `.venv`, `.venvs` and `build` into it (nothing is reinstalled),
and from the copy's root runs each step's command with relative paths: `strict-gate gate
gates/X.toml`, then `localize reports/X-<time>`, `show`, `nightly` twice, `gate --resume` after
a real SIGKILL. The copy, not the checkout, is what runs (PYTHONPATH is the copy's root): a test
that only ever ran from absolute temp directories is what let a relative-path bug through.

Each step is checked against its row (acceptance_table.py says how); the table is printed, and
results.json and results.md are written to --out. Exit 0 only when every expectation was met;
1 when one was not (a step not run because its engine is not installed included); 2 on a bad
table or arguments. Rows name no expectation the documentation does not state: the exit code
each gate's docs give, the figures benchmarks/README.md publishes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acceptance_table import REF, Outcome, Step, TableError, check, load_table, select, show_figures, uncovered_gates

ROOT = Path(__file__).resolve().parents[1]
LINKED = (".venv", ".venvs", "build")  # installed, ignored by git: linked into the copy, not reinstalled
OUTPUT_TAIL = 4000  # characters of each step's output kept in results.json


def make_copy(source: Path, rev: str, dest: Path) -> str:
    """`git archive REV` of source unpacked into dest, the installed trees linked; the commit."""
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.Popen(["git", "-C", str(source), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    for name in LINKED:
        target = (source / name).resolve()
        if target.exists():
            (dest / name).symlink_to(target, target_is_directory=True)
    return commit


def step_env(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)  # the copy's code, never the checkout the venv was installed from
    env["PATH"] = f"{copy / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    env["COLUMNS"] = "160"
    return env


class Runner:
    """Runs the steps in one copy, in order; a step's report is what later steps name."""

    def __init__(self, copy: Path, patterns: tuple[str, ...]):
        self.copy, self.patterns = copy, patterns
        self.reports: dict[str, Path | None] = {}
        self.env = step_env(copy)

    def run(self, step: Step) -> Outcome:
        missing = [n for n in step.needs if not (self.copy / Path(n).expanduser()).exists()]  # ~: a model cache
        if missing:
            return Outcome(None, "", None, 0.0, skipped=f"needs {', '.join(missing)} (not installed)")
        lost = [d for d in step.depends_on() if self.reports.get(d) is None]
        if lost:
            return Outcome(None, "", None, 0.0, skipped=f"no report from step {', '.join(lost)}")
        argv = shlex.split(self._fill(step.command))
        argv[0] = ".venv/bin/strict-gate"
        where = step.report_in
        before = self._listing(where)
        start, cpu = time.monotonic(), _children_cpu()
        code, output = self._execute(argv, step, where, before)
        seconds, cpu = time.monotonic() - start, _children_cpu() - cpu
        report = self._report_dir(step, where, before)
        self.reports[step.id] = report
        return Outcome(code, output, report, seconds, cpu_s=cpu)

    def _fill(self, text: str) -> str:
        return REF.sub(lambda m: str(self.reports[m.group(1)].relative_to(self.copy)), text)  # type: ignore[union-attr]

    def _listing(self, where: str) -> set[str]:
        d = self.copy / where
        return {p.name for p in d.iterdir() if p.is_dir()} if d.is_dir() else set()

    def _report_dir(self, step: Step, where: str, before: set[str]) -> Path | None:
        """The step's report: the path its row names, else the one new directory in `where`
        (the newest if several)."""
        if step.report:
            d = self.copy / self._fill(step.report)
            return d if d.is_dir() else None
        new = [self.copy / where / n for n in self._listing(where) - before]
        return max(new, key=lambda p: p.stat().st_mtime) if new else None

    def _execute(self, argv: list[str], step: Step, where: str, before: set[str]) -> tuple[int | None, str]:
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
            proc = subprocess.Popen(argv, cwd=self.copy, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            note = self._watch(proc, step, where, before)
            self._reap(proc)
            log.seek(0)
            return (None if "timed out" in note else proc.returncode), log.read() + note

    def _watch(self, proc: subprocess.Popen[bytes], step: Step, where: str, before: set[str]) -> str:
        """Wait for the step; SIGKILL it at its row's record count, or at its timeout."""
        deadline = time.monotonic() + step.timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                return f"\n[acceptance] timed out after {step.timeout_s} s: killed\n"
            if step.kill_at_records and self._records(where, before) >= step.kill_at_records:
                proc.send_signal(signal.SIGKILL)  # the gate process alone, as an OOM kill takes it
                proc.wait()
                return f"\n[acceptance] SIGKILL at {self._records(where, before)} records\n"
            time.sleep(0.2)
        return ""

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> None:
        """End what the step left in its session (engine children of a killed gate), by group id."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def _records(self, where: str, before: set[str]) -> int:
        """Records the step's run has written so far (the most of any arm's records.jsonl)."""
        counts = [0]
        for name in self._listing(where) - before:
            for f in (self.copy / where / name).glob("*/records.jsonl*"):  # .partial while it runs
                try:
                    counts.append(f.read_bytes().count(b"\n"))
                except OSError:
                    pass
        return max(counts)


def runner_imports(copy: Path) -> str:
    """Where the copy's interpreter imports strict_gate from: the copy, or the run tests the wrong code."""
    probe = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c", "import strict_gate; print(strict_gate.__file__)"],
                           cwd=copy, env=step_env(copy), capture_output=True, text=True)
    return probe.stdout.strip() or probe.stderr.strip()[-300:]


def _children_cpu() -> float:
    """CPU seconds of the reaped children so far: a step's cost that the machine's load does not
    stretch (its wall time on a loaded machine is not its cost on CI's)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.machine()}, Python {platform.python_version()}"


def result_row(step: Step, outcome: Outcome, unmet: list[str]) -> dict:
    return {
        "id": step.id, "tier": step.tier, "command": step.command, "why": step.why,
        "expected_exit": step.exit, "exit": outcome.exit, "seconds": round(outcome.seconds, 1),
        "cpu_s": round(outcome.cpu_s, 1),
        "figures": show_figures(step, outcome), "report": outcome.report_dir.name if outcome.report_dir else None,
        "passed": not unmet, "unmet": unmet, "output_tail": outcome.output[-OUTPUT_TAIL:],
    }


def markdown(meta: dict, rows: list[dict]) -> str:
    partial = "" if meta["complete"] else f" (partial: {meta['steps']} of {meta['selected']} steps so far)"
    lines = [f"# Acceptance run: tier {meta['tier']}, {meta['commit'][:12]}{partial}", "",
             f"Machine: {meta['machine']}. Command: `{meta['command']}`. "
             f"Wall time {meta['seconds']:.0f} s ({meta['cpu_s']:.0f} CPU s in the steps; load average "
             f"{meta['load']}); {meta['passed']}/{meta['steps']} steps met every expectation.", "",
             "| step | command | exit (expected) | figures: measured (expected) | wall s | CPU s | result |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        result = "ok" if r["passed"] else "**FAIL**: " + "; ".join(_cell(u) for u in r["unmet"][:4]) + (
            f" (+{len(r['unmet']) - 4} more)" if len(r["unmet"]) > 4 else "")
        lines.append(f"| {r['id']} | `{r['command']}` | {r['exit']} ({r['expected_exit']}) | {r['figures']} | "
                     f"{r['seconds']:.0f} | {r['cpu_s']:.0f} | {result} |")
    for gate in meta["uncovered"]:
        lines.append(f"| - | `{gate}` | - | - | - | - | **FAIL**: no row in benchmarks/acceptance.toml |")
    return "\n".join(lines) + "\n"


def _cell(text: str, limit: int = 240) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tier", choices=("fast", "full", "all"), default="fast")
    p.add_argument("--only", default="", help="step ids, comma-separated (their earlier steps come too)")
    p.add_argument("--rev", default="HEAD", help="the commit to copy and run (default HEAD)")
    p.add_argument("--table", type=Path, default=ROOT / "benchmarks" / "acceptance.toml")
    p.add_argument("--out", type=Path, help="results.json and results.md go here (default: the copy's acceptance/)")
    p.add_argument("--keep", action="store_true", help="keep the copy (it is kept anyway when a step failed)")
    p.add_argument("--list", action="store_true", help="print the selected steps and exit")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        table = load_table(args.table)
        steps = select(table, args.tier, tuple(s for s in args.only.split(",") if s))
    except TableError as e:
        print(f"acceptance: {e}", file=sys.stderr)
        return 2
    if args.list:
        for s in steps:
            print(f"{s.tier:5} {s.id:32} exit {s.exit:3}  {s.command}")
        return 0
    copy = Path(tempfile.mkdtemp(prefix="strict-gate-acceptance-"))
    commit = make_copy(ROOT, args.rev, copy)
    tier = f"{args.tier}, --only {args.only}" if args.only else args.tier
    print(f"acceptance: {len(steps)} steps ({tier}) on {commit[:12]}, in {copy}", flush=True)
    imported = runner_imports(copy)
    if not imported.startswith(str(copy)):
        print(f"acceptance: the copy's venv imports strict_gate from {imported}, not the copy", file=sys.stderr)
        return 2
    gate_files = sorted(str(p.relative_to(copy)) for p in (copy / "gates").glob("*.toml"))
    uncovered = uncovered_gates(gate_files, table.step) if not args.only else []
    out = args.out or copy / "acceptance"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"schema": "strict-gate/acceptance@1", "tier": tier, "commit": commit, "rev": args.rev,
            "machine": machine(), "command": "bash scripts/acceptance.sh " + shlex.join(argv),
            "selected": len(steps), "uncovered": uncovered, "copy": str(copy)}
    rows = run_steps(Runner(copy, table.scan.patterns), steps, table.scan.patterns, meta, out)
    passed = sum(r["passed"] for r in rows)
    print("\n" + markdown(meta, rows))
    ok = passed == len(rows) and not uncovered
    if ok and not args.keep and args.out:
        shutil.rmtree(copy, ignore_errors=True)
    print(f"acceptance: {'PASS' if ok else 'FAIL'}: {passed}/{len(rows)} steps met every expectation"
          f"{f', {len(uncovered)} gate(s) without a row' if uncovered else ''}; results in {out}")
    return 0 if ok else 1


def run_steps(runner: Runner, steps: tuple[Step, ...], patterns: tuple[str, ...], meta: dict, out: Path) -> list[dict]:
    """Each step in turn, checked; the results files rewritten after every step (a run stopped
    halfway keeps what it measured, marked partial)."""
    rows: list[dict] = []
    start, load = time.monotonic(), _load()
    for step in steps:
        print(f"--> {step.id}: {step.command}", flush=True)
        outcome = runner.run(step)
        unmet = check(step, outcome, patterns)
        rows.append(result_row(step, outcome, unmet))
        print(f"    exit {outcome.exit} (expected {step.exit}), {outcome.seconds:.0f} s, {outcome.cpu_s:.0f} CPU s: "
              f"{'ok' if not unmet else 'FAIL'} {show_figures(step, outcome)}", flush=True)
        for u in unmet[:6]:
            print(f"    - {_cell(u, 400)}", flush=True)
        meta.update({"seconds": round(time.monotonic() - start, 1), "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
                     "load": f"{load} at the start, {_load()} now", "steps": len(rows),
                     "passed": sum(r["passed"] for r in rows), "complete": len(rows) == meta["selected"]})
        (out / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
        (out / "results.md").write_text(markdown(meta, rows), encoding="utf-8")
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
