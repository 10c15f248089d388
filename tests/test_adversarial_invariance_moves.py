"""The candidate judged against the reference's own moves (issue 52), end to end: real gates
through the CLI, from a working directory with relative paths, both arms real command engines
(tests/engines/variant_engine.py) that move with the prefill chunk where they are told to.

The prompts' ids sum to 43 + 7i (q0..q5), so `--every 2` moves q1, q3, q5 alone; `--move-at 1`
moves token 1 instead of token 2. No mock.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import section, write_gate

HERE = Path(__file__).resolve().parent
ENGINE = HERE / "engines" / "variant_engine.py"
NAME = "chunked_prefill-2"
WITH, OWN, THEIRS, APART = ("moves with the reference", "the candidate moves where the reference stays",
                            "the reference moves, the candidate does not", "both move differently")


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """tmp_path as the working directory, the engine copied in: every path in the gate is relative."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "engines").mkdir()
    shutil.copy(ENGINE, tmp_path / "engines" / "variant_engine.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]})
                                       + "\n" for i in range(6)), encoding="utf-8")
    return tmp_path


def _arm(*flags: str) -> dict:
    return {"kind": "command", "command": [sys.executable, "engines/variant_engine.py", *flags], "timeout_s": 10.0}


def _gate(candidate: tuple[str, ...], reference: tuple[str, ...], policy: str = "strict",
          arms: tuple[str, ...] = ("candidate", "reference")) -> str:
    write_gate(Path("."), prompts="p.jsonl", max_tokens=4, top_logprobs=2, output_dir="out", policy="strict",
               reference=_arm(*reference), candidate=_arm(*candidate),
               invariance={"arms": list(arms), "chunked_prefill": [2], "policy": policy})
    return "gate.toml"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"COLUMNS": "200"})


def _report() -> tuple[Path, dict[tuple[str, str], dict]]:
    (path,) = Path("out").glob("*/report.json")
    inv = section(json.loads(path.read_text(encoding="utf-8")), "invariance")
    return path.parent, {(v["arm"], v["name"]): v for v in inv["variants"]}


def _beside(v: dict) -> dict[str, list[str]]:
    return {k: ids for k, ids in v["beside_reference"].items() if ids}


def _texts(d: Path) -> dict[str, str]:
    return {f: (d / f).read_text(encoding="utf-8") for f in ("report.md", "report.html", "junit.xml")}


def test_a_candidate_that_moves_exactly_where_the_reference_moves_passes(here):
    """Both arms move token 2 of every prompt under a 2-token chunk, the same way: the candidate
    emits exactly vLLM's tokens there too. Exit 0, each prompt "moves with the reference"."""
    p = _cli("gate", _gate(("--mode", "chunk"), ("--mode", "chunk")))
    assert p.returncode == 0, p.stdout + p.stderr
    d, v = _report()
    cand, ref = v[("candidate", NAME)], v[("reference", NAME)]
    assert cand["verdict"] == "pass" and cand["prompts_exact"] == 0  # it moved: the figure says so
    assert _beside(cand) == {WITH: [f"q{i}" for i in range(6)]}
    assert ref["verdict"] == "yardstick" and ref["beside_reference"] is None
    texts = _texts(d)
    assert f"q0` (run 1): prefill-chunk dependence at position 2 (batch-1 gap 3.0000, variant gap 3.0000): {WITH}" \
        in texts["report.md"]
    assert f"{WITH}: 6" in texts["report.html"] and "<failure" not in texts["junit.xml"]
    assert "q0: prefill-chunk dependence at position 2" in texts["junit.xml"] and WITH in texts["junit.xml"]
    assert f"{WITH}: 6" in p.stdout and "INVARIANT, policy strict" in p.stdout


def test_a_candidate_that_moves_where_the_reference_stays_fails(here):
    """The reference moves q1, q3, q5; the candidate every prompt: its moves on q0, q2, q4 are its
    own, the finding (exit 5); the shared ones are named, not counted."""
    p = _cli("gate", _gate(("--mode", "chunk"), ("--mode", "chunk", "--every", "2")))
    assert p.returncode == 5, p.stdout + p.stderr
    d, v = _report()
    cand = v[("candidate", NAME)]
    assert cand["verdict"] == "fail"
    assert _beside(cand) == {WITH: ["q1", "q3", "q5"], OWN: ["q0", "q2", "q4"]}
    texts = _texts(d)
    assert f"`q0` (run 1): prefill-chunk dependence at position 2 (batch-1 gap 3.0000, variant gap 3.0000): {OWN}" \
        in texts["report.md"]
    assert f"q0: prefill-chunk dependence at position 2 (batch-1 gap 3.0000, variant gap 3.0000): {OWN}" in \
        texts["junit.xml"] and "<failure" in texts["junit.xml"]
    assert OWN in texts["report.html"] and f"NOT INVARIANT (candidate:{NAME})" in p.stdout
    shown = _cli("show", str(d))
    assert shown.returncode == 0 and f"{OWN}: 3" in shown.stdout and f"{WITH}: 3" in shown.stdout, shown.stdout


def test_under_informational_the_candidates_own_move_is_reported_and_exits_0(here):
    p = _cli("gate", _gate(("--mode", "chunk"), ("--mode", "invariant"), policy="informational"))
    assert p.returncode == 0, p.stdout + p.stderr
    d, v = _report()
    assert v[("candidate", NAME)]["verdict"] == "fail" and _beside(v[("candidate", NAME)]) == {
        OWN: [f"q{i}" for i in range(6)]}
    assert OWN in _texts(d)["report.md"]


def test_a_reference_that_moves_alone_is_shown_as_its_own_and_the_gate_passes(here):
    p = _cli("gate", _gate(("--mode", "invariant"), ("--mode", "chunk", "--every", "2")))
    assert p.returncode == 0, p.stdout + p.stderr
    d, v = _report()
    cand, ref = v[("candidate", NAME)], v[("reference", NAME)]
    assert cand["verdict"] == "pass" and cand["prompts_exact"] == 6 and cand["divergences"] == []
    assert _beside(cand) == {THEIRS: ["q1", "q3", "q5"]}
    assert ref["verdict"] == "yardstick" and [m["id"] for m in ref["divergences"]] == ["q1", "q3", "q5"]
    texts = _texts(d)
    assert f"`q1` (run 1): {THEIRS}: the reference's prefill-chunk dependence at position 2" in texts["report.md"]
    assert "<failure" not in texts["junit.xml"] and "<error" not in texts["junit.xml"]
    assert f"{THEIRS}: 3" in p.stdout


def test_a_reference_that_moves_another_way_excuses_nothing(here):
    """Both move every prompt, the reference at token 1, the candidate at token 2: both move
    differently, a finding (exit 5), the reference's move named beside the candidate's."""
    p = _cli("gate", _gate(("--mode", "chunk"), ("--mode", "chunk", "--move-at", "1")))
    assert p.returncode == 5, p.stdout + p.stderr
    d, v = _report()
    assert _beside(v[("candidate", NAME)]) == {APART: [f"q{i}" for i in range(6)]}
    assert f"{APART} (the reference's: prefill-chunk dependence at position 1" in _texts(d)["report.md"]


def test_a_hostile_reference_that_claims_the_variant_but_ignores_it_excuses_nothing(here):
    """The reference's hello declares prefill_chunk and its runs ignore it (tokens as at batch 1):
    nothing of the candidate's is shared, every move its own, exit 5; the reference passes."""
    p = _cli("gate", _gate(("--mode", "chunk"), ("--mode", "invariant")))
    assert p.returncode == 5, p.stdout + p.stderr
    _, v = _report()
    assert _beside(v[("candidate", NAME)]) == {OWN: [f"q{i}" for i in range(6)]}
    assert v[("reference", NAME)]["verdict"] == "pass"
    requests = Path("out").glob(f"*/invariance/reference/{NAME}/records.jsonl")
    assert len(next(requests).read_text().splitlines()) == 6  # it was asked, and answered as at batch 1


def test_only_the_candidate_arm_judges_as_before(here):
    p = _cli("invariance", _gate(("--mode", "chunk"), ("--mode", "chunk"), arms=("candidate",)))
    assert p.returncode == 5, p.stdout + p.stderr
    (doc,) = [json.loads(x.read_text()) for x in Path("out").glob("*/invariance.json")]
    (v,) = doc["invariance"]["variants"]
    assert v["beside_reference"] is None and v["verdict"] == "fail" and WITH not in p.stdout
