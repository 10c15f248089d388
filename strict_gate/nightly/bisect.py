"""`strict-gate bisect`: the candidate commit where a gate started failing, by `git bisect run`.

Each step builds the candidate's checkout with the user's command and runs the gate against a
stored reference (the config's recorded baseline, or the live reference run once before the
bisection, into the bisect directory: vLLM is never reloaded), tokens only (no [speed], no
drift, no teacher-forced diagnosis, no [invariance], no [localize], no [golden]: nothing that
loads another engine or judges anything but the tokens), unless `--variant NAME` asks to bisect on one
[invariance] variant of the candidate (a commit where it moves is bad; with the reference in the
variants' `arms`, where it moves otherwise than the reference's own run of it, made once:
bisect_variant.py). The gate's exit code
becomes git's: pass -> good (0), fail -> bad (1), an engine failure or incomplete gate, or a
build that fails -> skip (125), bad input -> abort (128, the message kept). Both ends are
tested first: a --good that fails or a --bad that passes is bad input, not a bisection.

The repository is left as it was: `git bisect reset` (or a checkout of the original HEAD)
runs in a `finally`, after the step process group is stopped, on Ctrl-C too; and when bisect
itself is killed (SIGKILL: no `finally` runs), by a watchdog (bisect_watch.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path

from strict_gate.core.redact import scrub_json, scrub_tree
from strict_gate.engines.recorded import RecordedOptions
from strict_gate.errors import ExitCode, InputError, StrictGateError
from strict_gate.gate.config import ArmConfig, GateConfig, load_gate_config
from strict_gate.gate.outcome import new_report_dir
from strict_gate.gate.run import run_gate
from strict_gate.invariance.config import InvarianceConfig, InvariancePolicy
from strict_gate.invariance.config import of as invariance_of
from strict_gate.judge.stored import load_report
from strict_gate.nightly.bisect_variant import judged_step, reference_variant
from strict_gate.nightly.bisect_watch import Watchdog
from strict_gate.runs.records import write_text_atomic

BISECT_FILE = "bisect.json"
BISECT_SCHEMA = "strict-gate/bisect@1"
STATE_FILE = "state.json"
STEPS_FILE = "steps.jsonl"
GIT_TIMEOUT = 60


class StepVerdict(StrEnum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"
    ABORT = "abort"


GIT_CODE = {StepVerdict.GOOD: 0, StepVerdict.BAD: 1, StepVerdict.SKIP: 125, StepVerdict.ABORT: 128}
# 5: an [invariance] variant moved (a speculative run changed a token): as bad as a flip
VERDICT_OF_EXIT = {0: StepVerdict.GOOD, 1: StepVerdict.BAD, 2: StepVerdict.ABORT, 3: StepVerdict.SKIP,
                   5: StepVerdict.BAD}


@dataclass(frozen=True)
class Step:
    commit: str
    verdict: StepVerdict
    exit_code: int | None  # the gate's; None when the build failed and no gate ran
    report_dir: str | None
    message: str = ""  # why it was skipped or aborted


@dataclass(frozen=True)
class BisectOutcome:
    first_bad: str | None  # None: only skipped commits are left between the last good and first bad
    candidates: tuple[str, ...]  # the commits it could be, when first_bad is None
    steps: tuple[Step, ...]
    flipped: tuple[dict, ...]  # the prompts that fail at first_bad: id and status
    report_dir: str | None  # the gate report of first_bad
    path: Path  # bisect.json

    @property
    def exit_code(self) -> int:
        """0 when the first bad commit is named; 3 when skipped commits leave it open."""
        return 0 if self.first_bad else 3


# ---------------------------------------------------------------------------- git


def git(repo: Path, *args: str, check: bool = True) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=GIT_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        raise InputError(f"git {args[0]}: {e}", path=str(repo)) from None
    if check and out.returncode != 0:
        raise InputError(f"git {' '.join(args)}: {out.stderr.strip() or 'failed'}", path=str(repo))
    return out.stdout.strip()


def check_repo(repo: Path, good: str, bad: str) -> tuple[Path, str, str]:
    """(top level, good sha, bad sha), or bad input: not a repository, a bisection or local
    changes already there, an unknown revision, good not an ancestor of bad."""
    if not repo.is_dir():
        raise InputError("not a directory", path=str(repo))
    top = git(repo, "rev-parse", "--show-toplevel", check=False)
    if not top:
        raise InputError("not a git repository", path=str(repo))
    root = Path(top)
    if (root / git(root, "rev-parse", "--git-path", "BISECT_START")).exists():
        raise InputError("a bisection is already in progress here (`git bisect reset` ends it)", path=str(root))
    if git(root, "status", "--porcelain", "--untracked-files=no"):
        raise InputError("the repository has uncommitted changes: bisecting checks out other commits; "
                         "commit or discard them first", path=str(root))
    shas = []
    for flag, rev in (("--good", good), ("--bad", bad)):
        sha = git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        if not sha:
            raise InputError(f"{flag} {rev!r} is not a commit of this repository", path=str(root))
        shas.append(sha)
    if shas[0] == shas[1]:
        raise InputError(f"--good and --bad are the same commit ({shas[0][:12]}): nothing to bisect", path=str(root))
    merge = subprocess.run(["git", "merge-base", "--is-ancestor", shas[0], shas[1]], cwd=root, capture_output=True,
                           timeout=GIT_TIMEOUT)
    if merge.returncode != 0:
        raise InputError(f"--good {good!r} is not an ancestor of --bad {bad!r}", path=str(root))
    return root, shas[0], shas[1]


def _original_head(repo: Path) -> str:
    return git(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False) or git(repo, "rev-parse", "HEAD")


# ---------------------------------------------------------------------------- preparing the steps


def failing_prompts(report_dir: Path) -> list[str]:
    """The prompts a report says did not pass (`--prompts-from`); none is bad input."""
    report = load_report(report_dir)
    ids = [p.id for p in report.prompts if not p.passed]
    if not ids:
        raise InputError("no prompt failed in this report: nothing to narrow the bisection to", path=str(report_dir))
    return ids


def _subset(cfg: GateConfig, ids: list[str], out: Path) -> Path:
    """The config's prompt set cut down to `ids`, written into the bisect directory."""
    from strict_gate.runs.prompts import load_prompts

    ps = load_prompts(cfg.prompts)
    missing = sorted(set(ids) - set(ps.ids))
    if missing:
        raise InputError(f"the report's prompts {missing[:5]} are not in the gate's prompt set {cfg.prompts}")
    keep = set(ids)
    path = out / "prompts.jsonl"
    write_text_atomic(path, "".join(json.dumps(p.canonical(), ensure_ascii=False) + "\n"
                                    for p in ps.prompts if p.id in keep))
    return path


def _stored_reference(cfg: GateConfig, prompts: Path, out: Path) -> Path:
    """A run directory of the reference on `prompts`: the recorded baseline itself when it
    fits, else the reference (live, or the baseline replayed for a subset) run once, here."""
    from strict_gate.gate.arm import prompt_inputs, run_arm
    from strict_gate.runs.prompts import load_prompts
    from strict_gate.runs.records import Sampling

    sampling = Sampling(cfg.max_tokens, cfg.top_logprobs)
    engine = cfg.reference.build()
    engine.check_compatible(load_prompts(cfg.prompts).sha256, sampling)  # a baseline that does not fit: exit 2
    if engine.replays_run and prompts == cfg.prompts:
        return Path(engine.run.path)  # type: ignore[attr-defined]
    ps = load_prompts(prompts)
    try:
        inputs = prompt_inputs(ps, engine)
        runs = cfg.reference.runs if engine.measurable else 1  # a replay keeps the baseline's samples
        run_arm(engine, inputs, sampling, out / "reference", prompt_set=ps, runs=runs)
    finally:
        engine.close()
    return out / "reference"


def only_variant(cfg: GateConfig, name: str) -> InvarianceConfig:
    """The config's [invariance] cut to the candidate's variant `name`, judged strictly unless
    the config says near-tie (informational would never fail a step); else bad input."""
    inv = invariance_of(cfg)
    if inv is None:
        raise InputError(f"--variant {name!r}: the gate has no [invariance] table", path=cfg.path)
    chosen = [v for v in inv.variants if v.name == name]
    if not chosen:
        raise InputError(f"--variant {name!r} is not one of the [invariance] variants: "
                         + ", ".join(v.name for v in inv.variants), path=cfg.path)
    policy = InvariancePolicy.STRICT if inv.policy == InvariancePolicy.INFORMATIONAL else inv.policy
    return replace(inv, arms=("candidate",), variants=tuple(chosen), policy=policy)


def step_config(cfg: GateConfig, prompts: Path, reference: Path, out: Path, variant: str | None = None) -> GateConfig:
    """The gate each step runs: tokens only (or with one variant), against the stored reference."""
    recorded = ArmConfig("reference", "recorded", RecordedOptions(path=str(reference.resolve())),
                         base_dir=cfg.reference.base_dir)
    kept = {k: v for k, v in cfg.features.items() if k not in ("speed", "localize", "invariance", "drift", "golden")}
    if variant is not None:
        kept["invariance"] = only_variant(cfg, variant)
    return replace(cfg, prompts=prompts, reference=recorded, rescorer=None, diagnose=False, drift=False,
                   features=kept, output_dir=out / "steps")


# ---------------------------------------------------------------------------- one step


def run_step(state_path: Path) -> int:
    """One commit (the checkout git bisect run gives): build, gate, record; git's exit code."""
    state = json.loads(state_path.read_text(encoding="utf-8"))
    repo, out = Path(state["repo"]), Path(state["out"])
    commit = git(repo, "rev-parse", "HEAD")
    built = subprocess.run(state["build"], shell=True, cwd=repo, capture_output=True, text=True)
    if built.returncode != 0:
        tail = (built.stderr or built.stdout).strip().splitlines()[-3:]
        step = Step(commit, StepVerdict.SKIP, None, None, f"the build exited {built.returncode}: " + " | ".join(tail))
    else:
        step = _gate_step(commit, state, out)
    with open(out / STEPS_FILE, "a", encoding="utf-8") as f:  # a step's message may quote an engine's secret
        f.write(json.dumps(scrub_json(asdict(step))) + "\n")
    return GIT_CODE[step.verdict]


def _gate_step(commit: str, state: dict, out: Path) -> Step:
    try:
        cfg = load_gate_config(state["config"])
        cfg = step_config(cfg, Path(state["prompts"]), Path(state["reference"]), out, state.get("variant"))
        outcome = run_gate(cfg)
        result = judged_step(outcome.result, state["reference_variant"]) if state.get("reference_variant") \
            else outcome.result
    except StrictGateError as e:
        verdict = VERDICT_OF_EXIT.get(e.exit_code, StepVerdict.SKIP)
        return Step(commit, verdict, e.exit_code, None, str(e))
    except Exception as e:  # an engine bug at this commit: it cannot be judged here
        return Step(commit, StepVerdict.SKIP, 3, None, f"{type(e).__name__}: {e}")
    code = result.exit_code
    moved = {ExitCode.NOT_INVARIANT: StepVerdict.BAD} if state.get("variant") else {}
    verdict = (VERDICT_OF_EXIT | moved).get(code, StepVerdict.SKIP)
    return Step(commit, verdict, code, str(outcome.report_dir), "" if verdict is not StepVerdict.SKIP
                else "; ".join(result.problems) or "the gate was incomplete")


# ---------------------------------------------------------------------------- the bisection


def _steps(out: Path) -> list[Step]:
    try:
        lines = (out / STEPS_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [Step(**{**d, "verdict": StepVerdict(d["verdict"])}) for d in map(json.loads, lines)]


def _endpoint(repo: Path, state: Path, sha: str, flag: str, want: StepVerdict, watchdog: Watchdog) -> None:
    git(repo, "checkout", "-q", "--detach", sha)
    _in_group([sys.executable, "-m", "strict_gate.nightly.bisect", str(state)], repo, watchdog)
    steps = _steps(state.parent)
    if not steps:
        raise InputError(f"{flag} {sha[:12]}: the step recorded nothing")
    step = steps[-1]
    if step.verdict is not want:
        said = {StepVerdict.GOOD: "passes the gate", StepVerdict.BAD: "fails the gate"}.get(
            step.verdict, f"cannot be judged ({step.message})")
        raise InputError(f"{flag} {sha[:12]} {said}: it must {'pass' if want is StepVerdict.GOOD else 'fail'} "
                         f"to bisect between them" + (f"; its report: {step.report_dir}" if step.report_dir else ""))


def _in_group(cmd: list[str], repo: Path, watchdog: Watchdog) -> str:
    """`cmd` in its own process group, named to the watchdog, stopped with us; its output."""
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    watchdog.group(proc.pid)
    try:
        output, _ = proc.communicate()
    except BaseException:
        _stop(proc)
        raise
    return output


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def run_bisect(cfg: GateConfig, *, repo: Path, good: str, bad: str, build: str,
               prompts_from: Path | None = None, output_dir: Path | None = None,
               variant: str | None = None) -> BisectOutcome:
    """Bisect `repo` between good and bad; writes <output_dir>/<name>-bisect-<stamp>/bisect.json."""
    if variant is not None:
        only_variant(cfg, variant)  # bad input before anything is checked out
    root, good_sha, bad_sha = check_repo(repo, good, bad)
    ids = failing_prompts(prompts_from) if prompts_from is not None else None
    out = new_report_dir(output_dir or cfg.output_dir, f"{cfg.name}-bisect").resolve()
    prompts = _subset(cfg, ids, out) if ids is not None else cfg.prompts
    state = out / STATE_FILE
    paired_with = reference_variant(cfg, only_variant(cfg, variant), Path(prompts), out) if variant else None
    write_text_atomic(state, json.dumps({
        "repo": str(root), "out": str(out), "build": build, "config": str(Path(cfg.path).resolve()),
        "prompts": str(Path(prompts).resolve()), "reference": str(_stored_reference(cfg, prompts, out).resolve()),
        "variant": variant, "reference_variant": None if paired_with is None else str(paired_with),
    }))
    original, started = _original_head(root), False
    watchdog = Watchdog(root, original)  # restores the repository should we be killed
    try:
        _endpoint(root, state, bad_sha, "--bad", StepVerdict.BAD, watchdog)
        _endpoint(root, state, good_sha, "--good", StepVerdict.GOOD, watchdog)
        git(root, "checkout", "-q", original)
        git(root, "bisect", "start", bad_sha, good_sha)
        started = True
        output = _in_group(["git", "bisect", "run", sys.executable, "-m", "strict_gate.nightly.bisect", str(state)],
                           root, watchdog)
    finally:
        if started:
            git(root, "bisect", "reset", check=False)
        else:
            git(root, "checkout", "-q", original, check=False)
        watchdog.done()
    return _finish(root, out, good_sha, bad_sha, build, output)


def _finish(repo: Path, out: Path, good: str, bad: str, build: str, output: str) -> BisectOutcome:
    steps = _steps(out)
    aborted = [s for s in steps if s.verdict is StepVerdict.ABORT]
    if aborted:
        raise InputError(f"the gate refused its input at {aborted[-1].commit[:12]}: {aborted[-1].message}")
    found = re.search(r"^([0-9a-f]{40}) is the first bad commit", output, re.M)
    first_bad = found.group(1) if found else None
    candidates = () if found else tuple(re.findall(r"^([0-9a-f]{40})$", output, re.M))
    if not found and not candidates:
        raise InputError("git bisect run ended without naming a commit:\n" + "\n".join(output.splitlines()[-10:]))
    at = next((s for s in reversed(steps) if s.commit == first_bad), None)
    flipped: tuple[dict, ...] = ()
    if at is not None and at.report_dir:
        report = load_report(at.report_dir)
        flipped = tuple({"id": p.id, "status": str(p.status)} for p in report.prompts if not p.passed)
    outcome = BisectOutcome(first_bad, candidates, tuple(steps), flipped, at.report_dir if at else None,
                            out / BISECT_FILE)
    scrub_tree(out)  # every step's report directory too, before bisect.json says the bisection is whole
    write_text_atomic(outcome.path, json.dumps(scrub_json({
        "schema": BISECT_SCHEMA, "repo": str(repo), "good": good, "bad": bad, "build": build,
        "first_bad": first_bad, "subject": git(repo, "log", "-1", "--format=%s", first_bad) if first_bad else None,
        "candidates": list(candidates), "report_dir": outcome.report_dir, "flipped": list(flipped),
        "steps": [asdict(s) for s in steps],
    }), indent=2) + "\n")
    return outcome


def bisect_command(config: str | Path, repo: str | Path, good: str, bad: str, report_dir: str | Path) -> str:
    """The command line a nightly summary suggests (the build command is the user's own)."""
    return " ".join(shlex.quote(str(x)) for x in (
        "strict-gate", "bisect", config, "--repo", repo, "--good", good, "--bad", bad,
        "--build", "<your build command>", "--prompts-from", report_dir))


def main(argv: list[str]) -> int:
    """The step `git bisect run` calls. A step that cannot even run (its state unreadable, an
    interrupt) aborts the bisection: exit 1 would call the commit bad."""
    try:
        return run_step(Path(argv[1]))
    except BaseException as e:
        print(f"strict-gate bisect step: {type(e).__name__}: {e}", file=sys.stderr)
        return GIT_CODE[StepVerdict.ABORT]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
