"""An interrupted gate keeps a finished speculative variant with its sealed acceptance counts (issue 54).

A speculative variant's acceptance counts are the engine's counters over its run, on no record:
each finished run seals them beside it (acceptance.json), and a resume keeps the run only with
them. A real gate process (command engines: tests/engines/variant_engine.py --speculative, run
from the test's directory with relative paths) is stopped by a real SIGINT or SIGKILL at a known
point: after a speculative variant finished (it is kept, its engine asked nothing), inside one (it
runs again whole); a side file edited, truncated, of another schema, copied from another variant
or missing is refused, and that variant runs again. The engine appends "TAG generate ID specK" per
speculative request, so the test counts what `--resume` asks of each variant. No mock.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from helpers import write_gate
from test_adversarial_invariance_resume import ENGINE, PROMPTS, _cli, _count, _interrupt, _reports, _same_reports

from strict_gate.engines.speculative import Acceptance
from strict_gate.gate.acceptance import read_acceptance, write_acceptance
from strict_gate.runs.layout import RunDir

# each arm's invariance runs: the batch-1 run on one engine, then speculative-ngram-3 and
# speculative-ngram-2 on an engine each, 6 generate requests a run; the candidate's first
SPEC = {"arms": ["candidate", "reference"], "policy": "strict",
        "speculative": [{"method": "ngram", "num_speculative_tokens": 3},
                        {"method": "ngram", "num_speculative_tokens": 2}]}
NGRAM3 = Path("invariance", "candidate", "speculative-ngram-3")
NGRAM2 = Path("invariance", "candidate", "speculative-ngram-2")


def _setup(where: Path, **invariance) -> None:
    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(ENGINE, where / "variant_engine.py")
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]})
                                           + "\n" for i in range(PROMPTS)), encoding="utf-8")
    write_gate(where, prompts="p.jsonl", max_tokens=4, top_logprobs=2, output_dir="out", policy="strict",
               reference={"kind": "command", "command": ["python", "variant_engine.py", "--tag", "ref",
                                                         "--speculative"]},
               candidate={"kind": "command", "command": ["python", "variant_engine.py", "--tag", "cand",
                                                         "--speculative"], "timeout_s": 30.0},
               invariance=SPEC | invariance)


def _spec(where: Path, k: int, tag: str = "cand") -> int:
    """The generate requests of the speculative-ngram-K variant of an arm."""
    log = where / "requests.log"
    return sum(1 for line in log.read_text(encoding="utf-8").splitlines() if line.split()[:2] == [tag, "generate"]
               and line.split()[3:] == [f"spec{k}"])


def _acceptance(where: Path, report: Path) -> dict[tuple[str, str], object]:
    """Each variant's acceptance figures as its report gives them (report.json, or invariance.json)."""
    gate = where / report / "report.json"
    if gate.exists():
        variants = json.loads(gate.read_text())["features"]["invariance"]["section"]["variants"]
    else:
        variants = json.loads((where / report / "invariance.json").read_text())["invariance"]["variants"]
    return {(v["arm"], v["name"]): v["acceptance"] for v in variants}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """Each command run once without a signal: its exit code, requests and acceptance figures."""
    out = {}
    for command in ("gate", "invariance"):
        where = tmp_path_factory.mktemp(f"uninterrupted-{command}")
        _setup(where)
        p = _cli(where, command, "gate.toml")
        (d,) = [x.relative_to(where) for x in (where / "out").iterdir() if x.is_dir()]
        out[command] = {"rc": p.returncode, "generate": _count(where), "ngram3": _spec(where, 3),
                        "acceptance": _acceptance(where, d),
                        "reports": _reports(where, d) if command == "gate" else None}
    return out


# (command, the signal, where the engine holds: the next engine's start, after speculative-ngram-3 finished)
AFTER = {"gate, SIGINT": ("gate", signal.SIGINT, "cand:start:4"),
         "invariance, SIGKILL": ("invariance", signal.SIGKILL, "cand:start:3")}


@pytest.mark.parametrize("case", list(AFTER))
def test_a_finished_speculative_variant_is_kept_with_its_sealed_counts(tmp_path, monkeypatch, uninterrupted, case):
    """Was: speculative-ngram-3 ran again whole on every resume (6 generate requests, its engine
    started), its counts being on no disk."""
    monkeypatch.chdir(tmp_path)
    command, sig, hold = AFTER[case]
    want = uninterrupted[command]
    assert want["rc"] == 0 and want["ngram3"] == 6, want
    _setup(tmp_path)
    d, said = _interrupt(tmp_path, hold, sig, command=command)
    if sig == signal.SIGINT:
        flat = said.replace("\n", "")
        assert ("invariance, candidate arm, variant speculative-ngram-3 (6 records and its sealed acceptance "
                "counts)") in flat, said
        assert "--resume runs, not started yet: invariance, candidate arm, variant speculative-ngram-2" in flat, said
    before, ngram3, starts = _count(tmp_path), _spec(tmp_path, 3), _count(tmp_path, "start")
    p = _cli(tmp_path, command, "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _spec(tmp_path, 3) - ngram3 == 0  # kept: not one request
    assert _count(tmp_path, "start") - starts == 1  # speculative-ngram-2's engine only
    assert _count(tmp_path) - before == 6  # speculative-ngram-2's prompts, nothing else of the candidate
    assert _acceptance(tmp_path, d) == want["acceptance"]
    assert want["acceptance"][("candidate", "speculative-ngram-3")]["drafted"] == 18
    if command == "gate":
        _same_reports(_reports(tmp_path, d), want["reports"])


def _tamper(d: Path, how: str) -> None:
    """speculative-ngram-3's side file made hostile, speculative-ngram-2's left as it was."""
    side = d / NGRAM3 / "acceptance.json"
    body = json.loads(side.read_text())
    if how == "tampered counts, stale digest":  # drafted nothing: trusted, the variant would be incomplete
        body["acceptance"] |= {"drafted": 0, "accepted": 0, "drafts": 0, "replies_drafting": 0}
        side.write_text(json.dumps(body))
    elif how == "truncated":
        side.write_bytes(side.read_bytes()[: len(side.read_bytes()) // 2])
    elif how == "wrong schema":
        side.write_text(json.dumps(body | {"schema": "strict-gate/acceptance@2"}))
    elif how == "copied from another variant":
        shutil.copy(d / NGRAM2 / "acceptance.json", side)
    else:
        side.unlink()  # a kill between the run's last record and its counts


HOSTILE = {"tampered counts, stale digest": "its counts do not match its digest",
           "truncated": "unreadable (Input data was truncated)",
           "wrong schema": "schema 'strict-gate/acceptance@2', not 'strict-gate/acceptance@1'",
           "copied from another variant": "it belongs to another run (its records seal differs)",
           "missing": "its acceptance counts were never sealed beside it"}


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_side_file_is_not_trusted_and_its_variant_runs_again(tmp_path, monkeypatch, uninterrupted, how):
    monkeypatch.chdir(tmp_path)
    _setup(tmp_path)
    d, said = _interrupt(tmp_path, "ref:start:2", signal.SIGINT)  # both candidate variants finished
    assert "speculative-ngram-2 (6 records and its sealed acceptance counts)" in said.replace("\n", ""), said
    _tamper(tmp_path / d, how)
    ngram3, ngram2 = _spec(tmp_path, 3), _spec(tmp_path, 2)
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == uninterrupted["gate"]["rc"] == 0, p.stdout + p.stderr
    assert _spec(tmp_path, 3) - ngram3 == 6  # made again, every prompt
    assert _spec(tmp_path, 2) - ngram2 == 0  # its own side file verifies: kept
    told = " ".join(p.stderr.split())
    assert "candidate speculative-ngram-3 (made again: " in told and HOSTILE[how] in told, p.stderr
    assert _acceptance(tmp_path, d) == uninterrupted["gate"]["acceptance"]
    _same_reports(_reports(tmp_path, d), uninterrupted["gate"]["reports"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_speculative_variant_interrupted_mid_run_runs_all_its_prompts_again(tmp_path, monkeypatch, uninterrupted,
                                                                               sig):
    """Its counters covered only part of the run: no counts were sealed, nothing of it is kept."""
    monkeypatch.chdir(tmp_path)
    _setup(tmp_path)
    d, said = _interrupt(tmp_path, "cand:generate:15", sig)  # speculative-ngram-3's third prompt
    assert not (tmp_path / d / NGRAM3 / "acceptance.json").exists()
    if sig == signal.SIGINT:
        flat = said.replace("\n", "")
        assert "interrupted: the invariance phase: candidate arm, variant speculative-ngram-3, 2 of 6 records" in flat
        assert ("--resume runs again: invariance, candidate arm, variant speculative-ngram-3 (from its first record: "
                "its acceptance counts are the engine's counters over the whole run, sealed only once it finishes)"
                ) in flat, said
    ngram3 = _spec(tmp_path, 3)
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _spec(tmp_path, 3) - ngram3 == 6
    assert (tmp_path / d / NGRAM3 / "acceptance.json").exists()  # sealed once it finished
    assert _acceptance(tmp_path, d) == uninterrupted["gate"]["acceptance"]
    _same_reports(_reports(tmp_path, d), uninterrupted["gate"]["reports"])


def test_each_repeat_seals_its_own_counts_a_finished_one_kept(tmp_path, tmp_path_factory, monkeypatch):
    """repeats = 2: run 1's counts are sealed beside it and kept; run 2, cut short, runs again
    whole, and the variant's counts are the uninterrupted gate's (the sum of its runs')."""
    fresh = tmp_path_factory.mktemp("repeats-uninterrupted")
    _setup(fresh, arms=["candidate"], repeats=2)
    assert _cli(fresh, "gate", "gate.toml").returncode == 0
    (u,) = [x.relative_to(fresh) for x in (fresh / "out").iterdir() if x.is_dir()]
    monkeypatch.chdir(tmp_path)
    _setup(tmp_path, arms=["candidate"], repeats=2)
    d, _ = _interrupt(tmp_path, "cand:generate:21", signal.SIGKILL)  # the third prompt of run 2
    ngram3 = _spec(tmp_path, 3)
    p = _cli(tmp_path, "gate", "--resume", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _spec(tmp_path, 3) - ngram3 == 6  # run 2 only
    assert _acceptance(tmp_path, d) == _acceptance(fresh, u)
    assert _acceptance(fresh, u)[("candidate", "speculative-ngram-3")]["drafted"] == 2 * 18


def test_the_side_file_reads_back_only_for_its_own_run_and_key(tmp_path):
    """Counts the engine did not keep (None) are sealed too, and read back as unknown, not refused;
    a count below 0, a key the file does not know, another key or a run resealed are refused."""
    d = RunDir(tmp_path)
    d.seal.write_text("a" * 64 + "\n" + "b" * 64 + "\n")
    counts = Acceptance(18, 11, 6, replies=6, replies_drafting=6)
    for acceptance in (counts, None):
        write_acceptance(d, "k:invariance/candidate/x", acceptance)
        assert read_acceptance(d, "k:invariance/candidate/x") == acceptance
    assert "do not match its digest" in str(read_acceptance(d, "k:invariance/candidate/y"))
    write_acceptance(d, "k", counts)
    body = json.loads(d.acceptance.read_text())
    for edit, why in (({"acceptance": body["acceptance"] | {"drafted": -1}}, "Expected `int` >= 0"),
                      ({"extra": 1}, "unknown field `extra`"), ({"acceptance": "18"}, "Expected `object | null`")):
        d.acceptance.write_text(json.dumps(body | edit))
        assert why in str(read_acceptance(d, "k")), read_acceptance(d, "k")
    d.acceptance.write_text(json.dumps(body))
    d.seal.write_text("a" * 64 + "\n" + "c" * 64 + "\n")  # the run made again: another last digest
    assert "belongs to another run" in str(read_acceptance(d, "k"))
