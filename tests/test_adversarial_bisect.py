"""Hostile input to `strict-gate bisect`: each is exit 2 with a message, never a traceback,
and the repository is left as it was (on its branch, no bisection, nothing changed); Ctrl-C
in the middle of a step resets the bisection and stops the step's processes. Real git
repositories (tests/bisect_repo.py), the real CLI, a real SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bisect_repo import BUILD, FLIPPED, GOOD, commit, git, make_repo
from bisect_repo import gate_config as make_gate
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.nightly.bisect import main as step_main

runner = CliRunner()


def bisect(*args: object):
    return runner.invoke(app, ["bisect", *map(str, args)], terminal_width=200)


def refused(r, words: str) -> None:
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def untouched(repo: Path, sha: str) -> None:
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main" and git(repo, "rev-parse", "HEAD") == sha
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "BISECT_START").exists()


@pytest.fixture
def planted(tmp_path):
    repo, shas = make_repo(tmp_path)
    return repo, shas, make_gate(tmp_path, repo)


def test_not_a_repository_and_unknown_revisions(tmp_path, planted):
    repo, shas, config = planted
    plain = tmp_path / "plain"
    plain.mkdir()
    refused(bisect(config, "--repo", plain, "--good", "a", "--bad", "b", "--build", "true"), "not a git repository")
    refused(bisect(config, "--repo", tmp_path / "nowhere", "--good", "a", "--bad", "b", "--build", "true"),
            "not a directory")
    refused(bisect(config, "--repo", repo, "--good", "v0.0-nope", "--bad", "main", "--build", BUILD),
            "--good 'v0.0-nope' is not a commit of this repository")
    refused(bisect(config, "--repo", repo, "--good", shas[0], "--bad", "--help-me", "--build", BUILD),
            "is not a commit of this repository")
    untouched(repo, shas[6])


def test_good_must_be_an_ancestor_of_bad_and_differ_from_it(planted):
    repo, shas, config = planted
    refused(bisect(config, "--repo", repo, "--good", shas[6], "--bad", shas[0], "--build", BUILD),
            "is not an ancestor of --bad")
    refused(bisect(config, "--repo", repo, "--good", "main", "--bad", shas[6], "--build", BUILD),
            "the same commit")
    untouched(repo, shas[6])


def test_local_changes_and_a_bisection_in_progress_are_refused(planted):
    repo, shas, config = planted
    (repo / "README").write_text("edited, not committed\n")
    refused(bisect(config, "--repo", repo, "--good", shas[0], "--bad", "main", "--build", BUILD),
            "uncommitted changes")
    assert (repo / "README").read_text() == "edited, not committed\n"  # the edit is kept
    git(repo, "checkout", "--", "README")
    git(repo, "bisect", "start", shas[6], shas[0])
    refused(bisect(config, "--repo", repo, "--good", shas[0], "--bad", "main", "--build", BUILD),
            "already in progress")
    assert (repo / ".git" / "BISECT_START").exists()  # someone else's bisection is not reset by us
    git(repo, "bisect", "reset")
    untouched(repo, shas[6])


def test_ends_that_do_not_fail_and_pass_are_refused_with_the_repo_restored(planted):
    repo, shas, config = planted
    refused(bisect(config, "--repo", repo, "--good", shas[0], "--bad", shas[2], "--build", BUILD),
            f"--bad {shas[2][:12]} passes the gate")
    untouched(repo, shas[6])
    refused(bisect(config, "--repo", repo, "--good", shas[3], "--bad", shas[6], "--build", BUILD),
            f"--good {shas[3][:12]} fails the gate")
    untouched(repo, shas[6])
    refused(bisect(config, "--repo", repo, "--good", shas[0], "--bad", shas[1], "--build", BUILD),
            f"--bad {shas[1][:12]} cannot be judged (the build exited 1")
    untouched(repo, shas[6])


def test_a_gate_that_refuses_its_input_at_a_step_aborts_the_bisection(tmp_path):
    """The gate config lives in the candidate's repository; commit 2 breaks it (a misspelt key):
    the gate's exit 2 there is not a bad commit, it stops the bisection with the gate's message."""
    root = tmp_path
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    text = make_gate(root, repo).read_text()
    c1 = commit(repo, "1", **{"engine.py": GOOD, "gate.toml": text})
    commit(repo, "2", **{"gate.toml": text.replace("policy =", "polcy =")})
    commit(repo, "3", **{"gate.toml": text, "engine.py": FLIPPED})
    c4 = commit(repo, "4", README="docs\n")
    r = bisect(repo / "gate.toml", "--repo", repo, "--good", c1, "--bad", c4, "--build", BUILD)
    refused(r, "the gate refused its input at")
    assert "unknown key 'polcy'" in r.output
    untouched(repo, c4)


def test_a_step_that_cannot_run_aborts_rather_than_calling_the_commit_bad(tmp_path):
    assert step_main(["step", str(tmp_path / "no-state.json")]) == 128  # git bisect run: >= 128 aborts


def test_ctrl_c_in_a_step_resets_the_bisection_and_stops_the_build(planted, tmp_path):
    repo, shas, config = planted
    count, pidfile = tmp_path / "builds", tmp_path / "build.pid"
    # the ends are builds 1 and 2; build 3 is inside git bisect run: it hangs there
    build = (f'echo x >> {count}; if [ "$(wc -l < {count})" -ge 3 ]; then echo $$ > {pidfile}; sleep 120; fi; '
             + BUILD)
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "bisect", str(config), "--repo", str(repo),
                             "--good", shas[0], "--bad", "main", "--build", build],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    assert (repo / ".git" / "BISECT_START").exists()  # mid-bisection
    build_pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert "Traceback" not in out and "interrupted" in out
    untouched(repo, shas[6])
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the build's shell was in the step's process group, stopped with it
            os.kill(build_pid, 0)
            time.sleep(0.1)


def test_sigkill_of_bisect_stops_git_bisect_run_and_restores_the_repository(planted, tmp_path, monkeypatch):
    """A real SIGKILL of `strict-gate bisect` (run from the repository's parent directory with
    relative paths) while `git bisect run` is in a step. Was: git bisect run went on checking
    out commits in the user's repository and running the build and the gate, then left it
    detached and "bisecting". The step's group id is recorded by the build itself; whatever
    happens, the test stops that group and resets the repository in its own `finally`."""
    repo, shas, config = planted
    monkeypatch.chdir(tmp_path)
    count, group = tmp_path / "builds", tmp_path / "group"
    # builds 1 and 2 are the ends; build 3 is inside git bisect run: it records its group, then waits
    build = (f'echo x >> {count}; if [ "$(wc -l < {count})" -eq 3 ]; then ps -o pgid= -p $$ > {group}; '
             f'sleep 8; fi; ' + BUILD)
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "bisect", config.name, "--repo", repo.name,
                             "--good", shas[0], "--bad", "main", "--build", build, "-o", "out"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pgid = None
    try:
        deadline = time.monotonic() + 120
        while not (group.exists() and group.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        pgid = int(group.read_text())
        assert (repo / ".git" / "BISECT_START").exists()  # mid-bisection
        proc.kill()  # SIGKILL: no handler, no finally
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (repo / ".git" / "BISECT_START").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        untouched(repo, shas[6])
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)  # git bisect run and its step are gone
        time.sleep(10)  # longer than the build's wait: nothing goes on building
        assert count.read_text().count("x") == 3
        untouched(repo, shas[6])
    finally:
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["git", "bisect", "reset"], cwd=repo, capture_output=True)


VARIANT_ENGINE = Path(__file__).resolve().parent / "engines" / "variant_engine.py"


def _variant_repo(root: Path) -> tuple[Path, list[str]]:
    """An engine whose tokens pass at commit 1, move only in batches from commit 2 (its tokens
    at batch 1 unchanged), differ at batch 1 from commit 3; commit 4 is docs."""
    def engine(*flags: str) -> str:
        return (f"import runpy\nimport sys\nsys.argv = [sys.argv[0], *{list(flags)!r}]\n"
                f"runpy.run_path({str(VARIANT_ENGINE)!r}, run_name='__main__')\n")

    repo = root / "engine-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    shas = [commit(repo, "1", **{"engine.py": engine("--mode", "invariant")}),
            commit(repo, "2: batches move", **{"engine.py": engine("--mode", "in_flight")}),
            commit(repo, "3: tokens move", **{"engine.py": engine("--mode", "in_flight", "--shift", "1")}),
            commit(repo, "4: docs", README="v4\n")]
    prompts = "".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7]}) + "\n" for i in range(4))
    (root / "prompts.jsonl").write_text(prompts)
    (root / "gate.toml").write_text(
        'name = "variant-bisect"\nprompts = "prompts.jsonl"\nmax_tokens = 4\ntop_logprobs = 2\npolicy = "strict"\n'
        'output_dir = "reports"\n'
        f'[reference]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(VARIANT_ENGINE)])}\n'
        f'[candidate]\nkind = "command"\ncommand = {json.dumps([sys.executable, "engine-repo/engine.py"])}\n'
        '[invariance]\nbatch = [4]\npolicy = "strict"\n')
    return repo, shas


def test_bisect_steps_are_the_gates_tokens_only_unless_a_variant_is_asked_for(tmp_path, monkeypatch):
    """Commit 2 moves only under [invariance] batch 4 (exit 5 as a gate), commit 3 flips the
    tokens. Was: every step ran [invariance]; commit 2 was skipped as "incomplete" and bisect
    exited 3 naming two candidates. Now the steps judge the tokens (first bad: commit 3), and
    --variant batch-4 bisects on the variant (first bad: commit 2)."""
    monkeypatch.chdir(tmp_path)
    repo, shas = _variant_repo(tmp_path)
    r = bisect("gate.toml", "--repo", "engine-repo", "--good", shas[0], "--bad", "main", "--build", BUILD)
    assert r.exit_code == 0, r.output
    assert f"first bad commit: {shas[2]}" in r.output
    untouched(repo, shas[3])
    r = bisect("gate.toml", "--repo", "engine-repo", "--good", shas[0], "--bad", "main", "--build", BUILD,
               "--variant", "batch-4")
    assert r.exit_code == 0, r.output
    assert f"first bad commit: {shas[1]}" in r.output
    untouched(repo, shas[3])
    refused(bisect("gate.toml", "--repo", "engine-repo", "--good", shas[0], "--bad", "main", "--build", BUILD,
                   "--variant", "batch-8"), "--variant 'batch-8' is not one of the [invariance] variants: batch-4")
