"""`strict-gate bisect` on a real git repository (tests/bisect_repo.py): seven commits of a
small command engine, the second does not build, the fourth flips two prompts. Real git, real
engine processes, the real CLI; nothing mocked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bisect_repo import BUILD, git, make_repo
from bisect_repo import gate_config as make_gate
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.gate.config import load_gate_config
from strict_gate.nightly.loop import bisect_hint

runner = CliRunner()

HISTORY = "strict-gate/history@1"  # the lines the validating history reader reads


def bisect(*args: str):
    return runner.invoke(app, ["bisect", *map(str, args)], terminal_width=200)


def clean(repo: Path, sha: str) -> None:
    """Left as it was: on main at `sha`, no bisection, nothing changed or added."""
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main" and git(repo, "rev-parse", "HEAD") == sha
    assert git(repo, "status", "--porcelain", "--ignored") == ""
    assert not (repo / ".git" / "BISECT_START").exists()


def test_bisect_names_the_fourth_commit_and_the_prompts_it_flipped(tmp_path):
    repo, shas = make_repo(tmp_path)
    config = make_gate(tmp_path, repo)
    r = bisect(config, "--repo", repo, "--good", shas[0], "--bad", "main", "--build", BUILD)
    assert r.exit_code == 0, r.output
    assert f"first bad commit: {shas[3]}" in r.output
    assert "prompts that flipped there: p1 (divergent), p3 (divergent)" in r.output
    clean(repo, shas[6])
    (out,) = (tmp_path / "reports").glob("bisect-demo-bisect-*/")
    data = json.loads((out / "bisect.json").read_text())
    assert data["first_bad"] == shas[3] and data["subject"] == "4: a faster third token"
    assert [p["id"] for p in data["flipped"]] == ["p1", "p3"]
    assert Path(data["report_dir"]).parent == out / "steps" and (Path(data["report_dir"]) / "report.json").is_file()
    steps = {s["commit"]: s for s in data["steps"]}
    assert steps[shas[6]]["verdict"] == "bad" and steps[shas[0]]["verdict"] == "good"  # both ends tested first
    assert steps[shas[3]]["verdict"] == "bad" and steps[shas[3]]["exit_code"] == 1
    assert all(set(s) == {"commit", "verdict", "exit_code", "report_dir", "message"} for s in data["steps"])
    # the live reference ran once, into the bisect directory; every step replayed it
    assert (out / "reference" / "records.jsonl").is_file()
    step_report = json.loads((Path(data["report_dir"]) / "report.json").read_text())
    assert step_report["engines"]["reference"]["options"]["replayed_from"] == str(out / "reference")


def test_a_commit_that_does_not_build_is_skipped_never_called_bad(tmp_path):
    """The build fails on commits 2 and 3 here: after commit 4 is bad both are skipped, and the
    first bad commit is left open between them and commit 4 (exit 3), not guessed."""
    repo, shas = make_repo(tmp_path)
    build = f"! grep -q '# fixed' engine.py && {BUILD}"
    r = bisect(make_gate(tmp_path, repo), "--repo", repo, "--good", shas[0], "--bad", shas[6], "--build", build)
    assert r.exit_code == 3, r.output
    (out,) = (tmp_path / "reports").glob("bisect-demo-bisect-*/")
    data = json.loads((out / "bisect.json").read_text())
    assert data["first_bad"] is None and set(data["candidates"]) == {shas[1], shas[2], shas[3]}
    skipped = {s["commit"]: s for s in data["steps"] if s["verdict"] == "skip"}
    assert set(skipped) == {shas[1], shas[2]}
    assert all(s["exit_code"] is None and "the build exited 1" in s["message"] for s in skipped.values())
    clean(repo, shas[6])


def test_prompts_from_runs_only_the_failing_prompts(tmp_path):
    repo, shas = make_repo(tmp_path)
    config = make_gate(tmp_path, repo)
    night = runner.invoke(app, ["gate", str(config)])  # tonight, at commit 7: p1 and p3 fail
    assert night.exit_code == 1, night.output
    (report,) = (tmp_path / "reports").glob("bisect-demo-2*/")
    r = bisect(config, "--repo", repo, "--good", shas[0], "--bad", shas[6], "--build", BUILD, "--prompts-from", report)
    assert r.exit_code == 0 and f"first bad commit: {shas[3]}" in r.output, r.output
    (out,) = (tmp_path / "reports").glob("bisect-demo-bisect-*/")
    assert [json.loads(line)["id"] for line in (out / "prompts.jsonl").read_text().splitlines()] == ["p1", "p3"]
    data = json.loads((out / "bisect.json").read_text())
    for step in data["steps"]:
        ids = [p["id"] for p in json.loads((Path(step["report_dir"]) / "report.json").read_text())["prompts"]]
        assert ids == ["p1", "p3"]


def test_a_recorded_baseline_is_replayed_as_it_is(tmp_path):
    """The usual nightly reference: a stored run. It fits the whole prompt set, so the steps
    replay it where it lies (no copy, no reference run in the bisect directory)."""
    repo, shas = make_repo(tmp_path)
    live = make_gate(tmp_path, repo)
    baseline = tmp_path / "baseline"
    made = runner.invoke(app, ["run", str(live), "--prompts", str(tmp_path / "prompts.jsonl"), "--out", str(baseline),
                               "--max-tokens", "4", "--top-logprobs", "2"])
    assert made.exit_code == 0, made.output
    config = make_gate(tmp_path, repo, baseline=baseline)
    r = bisect(config, "--repo", repo, "--good", shas[0], "--bad", shas[6], "--build", BUILD)
    assert r.exit_code == 0 and f"first bad commit: {shas[3]}" in r.output, r.output
    (out,) = (tmp_path / "reports").glob("bisect-demo-bisect-*/")
    assert not (out / "reference").exists()
    data = json.loads((out / "bisect.json").read_text())
    report = json.loads((Path(data["report_dir"]) / "report.json").read_text())
    assert report["engines"]["reference"]["options"]["replayed_from"] == str(baseline)
    clean(repo, shas[6])


def test_the_nightly_summary_prints_the_bisect_command_from_the_history(tmp_path):
    """The history records the commit of the checkout holding the gate config: here the gate
    config lives in the candidate's repository, as in a CI of the engine's own repo."""
    repo, shas = make_repo(tmp_path)
    config = make_gate(tmp_path, repo)
    inside = repo / "gate.toml"
    inside.write_text(config.read_text())
    cfg = load_gate_config(inside)
    out = tmp_path / "nights"
    out.mkdir()
    nights = [("pass", shas[0]), ("fail", shas[3]), ("pass", shas[2]), ("fail", shas[6])]
    (out / "history.jsonl").write_text("".join(json.dumps({"schema": HISTORY, "gate": "bisect-demo", "verdict": v, "commit": c}) + "\n"
                                               for v, c in nights))
    hint = bisect_hint(cfg, out, out / "tonight", failed=True)
    assert f"--good {shas[2]} --bad {shas[6]}" in hint and f"--repo {repo}" in hint
    assert f"strict-gate bisect {inside}" in hint and f"--prompts-from {out / 'tonight'}" in hint
    assert bisect_hint(cfg, out, out / "tonight", failed=False) == ""
    (out / "history.jsonl").write_text(json.dumps({"schema": HISTORY, "gate": "bisect-demo", "verdict": "fail", "commit": None}) + "\n")
    assert "No bisect command: the history has no commit for tonight" in bisect_hint(cfg, out, out, failed=True)
    same = [("pass", shas[6]), ("fail", shas[6])]
    (out / "history.jsonl").write_text("".join(json.dumps({"schema": HISTORY, "gate": "bisect-demo", "verdict": v, "commit": c}) + "\n"
                                               for v, c in same))
    assert "nothing to bisect here" in bisect_hint(cfg, out, out, failed=True)


def test_bisect_is_in_the_help():
    r = runner.invoke(app, ["bisect", "--help"], terminal_width=200)
    assert r.exit_code == 0 and "--prompts-from" in r.output and sys.executable not in r.output


SPEC_ENGINE = '''#!/usr/bin/env python
import json
import sys

BROKEN = {broken}
print(json.dumps({{"hello": "strict-gate/engine@1", "name": "spec", "version": "1",
                  "capabilities": ["generate", "speculative"]}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    spec = req.get("speculative")
    base = req["prompt_token_ids"][-1]
    flip = BROKEN and spec is not None and req["id"] == "p1"
    toks = [(base + i + 1 + (500 if flip and i == 2 else 0)) % 1000 for i in range(req["max_tokens"])]
    out = {{"id": req["id"], "token_ids": toks, "finish_reason": "length",
           "top_logprobs": [[[t, -0.1], [(t + 1) % 1000, -5.0]] for t in toks]}}
    if spec is not None:
        out["speculative"] = {{"drafted": 3, "accepted": 1}}
    print(json.dumps(out), flush=True)
'''


def test_bisect_finds_the_commit_that_broke_speculation_alone(tmp_path):
    """The plain tokens never change; from commit 3 on speculation changes p1's third token. With
    `--variant` the candidate's speculative variant runs at every step, and its exit 5 marks the
    commit bad (steps are the tokens only without it)."""
    from bisect_repo import PROMPTS, commit

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    shas = [commit(repo, "1: engine", **{"engine.py": SPEC_ENGINE.format(broken=False)}),
            commit(repo, "2: docs", README="v2\n"),
            commit(repo, "3: a faster verifier", **{"engine.py": SPEC_ENGINE.format(broken=True)}),
            commit(repo, "4: docs", README="v4\n")]
    (tmp_path / "ref.py").write_text(SPEC_ENGINE.format(broken=False))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = tmp_path / "gate.toml"
    config.write_text(
        f'name = "spec-bisect"\nprompts = "{tmp_path / "p.jsonl"}"\nmax_tokens = 4\ntop_logprobs = 2\n'
        f'policy = "strict"\noutput_dir = "{tmp_path / "reports"}"\n'
        f'[reference]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(tmp_path / "ref.py")])}\n'
        f'[candidate]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(repo / "engine.py")])}\n'
        '[invariance]\narms = ["candidate", "reference"]\npolicy = "strict"\n'
        'speculative = [{ method = "ngram", num_speculative_tokens = 3 }]\n')
    r = bisect(config, "--repo", repo, "--good", shas[0], "--bad", "main", "--build", BUILD,
               "--variant", "speculative-ngram-3")
    assert r.exit_code == 0, r.output
    assert f"first bad commit: {shas[2]}" in r.output
    clean(repo, shas[3])
    (out,) = (tmp_path / "reports").glob("spec-bisect-bisect-*/")
    steps = {s["commit"]: s for s in json.loads((out / "bisect.json").read_text())["steps"]}
    assert steps[shas[2]]["verdict"] == "bad" and steps[shas[2]]["exit_code"] == 5
    assert steps[shas[0]]["verdict"] == "good"


PAIRED_ENGINE = SPEC_ENGINE.replace("BROKEN = {broken}", "MOVES = {moves}").replace(
    'flip = BROKEN and spec is not None and req["id"] == "p1"', 'flip = spec is not None and req["id"] in MOVES')


def test_bisect_with_the_reference_in_the_arms_calls_a_move_with_the_reference_good(tmp_path):
    """The reference itself moves p1 under speculation. Commit 1 moves nothing, commit 2 moves p1
    as the reference does (good: it emits the reference's tokens under the variant too), commit 4
    moves p3 as well, where the reference stays (bad). The reference's variant runs once, before
    the first step, and every step is judged beside it."""
    from bisect_repo import PROMPTS, commit

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    shas = [commit(repo, "1: engine", **{"engine.py": PAIRED_ENGINE.format(moves=set())}),
            commit(repo, "2: verifier as vLLM's", **{"engine.py": PAIRED_ENGINE.format(moves={"p1"})}),
            commit(repo, "3: docs", README="v3\n"),
            commit(repo, "4: a faster verifier", **{"engine.py": PAIRED_ENGINE.format(moves={"p1", "p3"})}),
            commit(repo, "5: docs", README="v5\n")]
    (tmp_path / "ref.py").write_text(PAIRED_ENGINE.format(moves={"p1"}))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = tmp_path / "gate.toml"
    config.write_text(
        f'name = "paired-bisect"\nprompts = "{tmp_path / "p.jsonl"}"\nmax_tokens = 4\ntop_logprobs = 2\n'
        f'policy = "strict"\noutput_dir = "{tmp_path / "reports"}"\n'
        f'[reference]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(tmp_path / "ref.py")])}\n'
        f'[candidate]\nkind = "command"\ncommand = {json.dumps([sys.executable, str(repo / "engine.py")])}\n'
        '[invariance]\narms = ["candidate", "reference"]\npolicy = "strict"\n'
        'speculative = [{ method = "ngram", num_speculative_tokens = 3 }]\n')
    r = bisect(config, "--repo", repo, "--good", shas[1], "--bad", "main", "--build", BUILD,
               "--variant", "speculative-ngram-3")
    assert r.exit_code == 0, r.output  # a --good that moved with the reference is good, not "it fails"
    assert f"first bad commit: {shas[3]}" in r.output
    clean(repo, shas[4])
    (out,) = (tmp_path / "reports").glob("paired-bisect-bisect-*/")
    state = json.loads((out / "state.json").read_text())
    assert state["reference_variant"] == str(out / "reference-variant.json")
    ref = json.loads((out / "reference-variant.json").read_text())
    (v,) = ref["variants"]
    assert v["arm"] == "reference" and [m["id"] for m in v["divergences"]] == ["p1"]
    assert len(list((out / "reference-variant" / "reference").iterdir())) == 2  # batch-1 and the variant, once
    steps = {s["commit"]: s for s in json.loads((out / "bisect.json").read_text())["steps"]}
    assert steps[shas[1]]["verdict"] == "good" and steps[shas[1]]["exit_code"] == 0
    assert steps[shas[3]]["verdict"] == "bad" and steps[shas[3]]["exit_code"] == 5
