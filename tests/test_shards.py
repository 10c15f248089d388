"""Static shards (docs/scale-out.md, section 3): `strict-gate run --shard I/N` on a real command
engine, `strict-gate merge`, and the merged run gated as a recorded arm; every hostile set of
shards is exit 2 naming the shard and the prompt. Run from a working directory with relative
paths, as the docs' Kubernetes and Slurm recipes run them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strict_gate.errors import InputError
from strict_gate.shards.spec import Shard, order

ENGINE = Path(__file__).parent / "engines" / "conformant_engine.py"
N_PROMPTS = 11


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A working directory with the engine, 11 prompts, three shards and an unsharded run."""
    where = tmp_path_factory.mktemp("shards")
    shutil.copy(ENGINE, where / "engine.py")
    (where / "p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, i + 3]}) + "\n"
                                           for i in range(N_PROMPTS)))
    (where / "eng.toml").write_text('kind = "command"\ncommand = ["python", "engine.py"]\nmodel = "toy"\n')
    for i in range(3):
        out = cli("run", "eng.toml", "-p", "p.jsonl", "--out", f"shard{i}", "--shard", f"{i}/3", "--max-tokens", "4",
                  cwd=where)
        assert out.returncode == 0, out.stdout + out.stderr
    out = cli("run", "eng.toml", "-p", "p.jsonl", "--out", "whole", "--max-tokens", "4", cwd=where)
    assert out.returncode == 0, out.stdout + out.stderr
    return where


def records(run: Path) -> list[dict]:
    """A run's records without their timings (the one field a machine changes)."""
    return [{k: v for k, v in json.loads(line).items() if k != "timing"}
            for line in (run / "records.jsonl").read_text().splitlines()]


def test_a_shard_holds_every_nth_prompt_and_says_where_it_sits(made):
    manifest = json.loads((made / "shard1" / "manifest.json").read_text())
    assert manifest["prompt_set"]["ids"] == ["p1", "p4", "p7", "p10"]
    assert manifest["prompt_set"]["shard"] == {"index": 1, "of": 3, "count": N_PROMPTS}
    whole = json.loads((made / "whole" / "manifest.json").read_text())
    assert manifest["prompt_set"]["sha256"] == whole["prompt_set"]["sha256"] and "shard" not in whole["prompt_set"]


def test_merged_shards_equal_the_unsharded_run_and_gate_as_a_recorded_arm(made, monkeypatch):
    monkeypatch.chdir(made)
    out = cli("merge", "shard2", "shard0", "shard1", "--prompts", "p.jsonl", "--out", "merged", cwd=made)
    assert out.returncode == 0, out.stdout + out.stderr
    assert records(Path("merged")) == records(Path("whole"))  # tokens and logprobs, in the set's order
    merged = json.loads(Path("merged/manifest.json").read_text())
    assert [m["index"] for m in merged["prompt_set"]["merged"]] == [0, 1, 2] and merged["status"] == "complete"
    Path("g.toml").write_text('name = "sharded"\nprompts = "p.jsonl"\nmax_tokens = 4\ntop_logprobs = 5\n'
                              'policy = "strict"\noutput_dir = "reports"\n'
                              '[reference]\nkind = "recorded"\npath = "merged"\nmodel = "toy"\n'
                              '[candidate]\nkind = "recorded"\npath = "whole"\n')
    gate = cli("gate", "g.toml", cwd=made)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert f"all {N_PROMPTS} prompts pass" in gate.stdout


def _edit(run: Path, change) -> None:
    m = json.loads((run / "manifest.json").read_text())
    change(m)
    (run / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(("case", "shards", "said"), [
    ("a shard missing", ["shard0", "shard1"], "shard 2/3 is missing"),
    ("a shard twice", ["shard0", "shard1", "shard1", "shard2"], "is given twice"),
    ("an unsharded run", ["shard0", "shard1", "whole"], "not a shard run"),
    ("another model", ["shard0", "shard1", "other-model"], "model 'other'"),
    ("another sampling", ["shard0", "shard1", "other-sampling"], "sampling"),
    ("a prompt in two shards", ["shard0", "shard1", "dup"], "prompt 'p0'"),
    ("a shard missing a record", ["shard0", "shard1", "short"], "prompt 'p2'"),
])
def test_shards_that_are_not_one_runs_are_refused_naming_shard_and_prompt(made, tmp_path, case, shards, said):
    where = tmp_path / "w"
    shutil.copytree(made, where, ignore=shutil.ignore_patterns("merged", "reports"))
    for name, change in (("other-model", lambda m: m["engine"].update(model="other")),
                         ("other-sampling", lambda m: m["sampling"].update(max_tokens=5)),
                         ("dup", lambda m: m["prompt_set"].update(ids=["p0", "p5", "p8"]))):
        shutil.copytree(where / "shard2", where / name)
        _edit(where / name, change)
    if "dup" in shards:  # its records follow its (hostile) ids
        lines = (where / "dup" / "records.jsonl").read_text().splitlines()
        first = json.loads((where / "shard0" / "records.jsonl").read_text().splitlines()[0])
        (where / "dup" / "records.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    shutil.copytree(where / "shard2", where / "short")
    lines = (where / "short" / "records.jsonl").read_text().splitlines()
    (where / "short" / "records.jsonl").write_text("\n".join(lines[1:]) + "\n")
    _edit(where / "short", lambda m: m.update(records=len(lines) - 1))
    out = cli("merge", *shards, "--out", "merged", cwd=where)
    assert out.returncode == 2, (case, out.stdout, out.stderr)
    assert said in out.stdout + out.stderr and "Traceback" not in out.stderr, (case, out.stderr)
    assert not (where / "merged").exists()


def test_an_unfinished_shard_is_an_incomplete_run_exit_3(made, tmp_path):
    shutil.copytree(made / "shard2", tmp_path / "running")
    _edit(tmp_path / "running", lambda m: m.update(status="running"))
    out = cli("merge", str(made / "shard0"), str(made / "shard1"), str(tmp_path / "running"), "--out",
              str(tmp_path / "m"))
    assert out.returncode == 3 and "not finished" in out.stderr and not (tmp_path / "m").exists()


def test_merge_checks_the_prompt_file_when_given(made, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [9, i]}) + "\n" for i in range(N_PROMPTS)))
    out = cli("merge", str(made / "shard0"), str(made / "shard1"), str(made / "shard2"), "--prompts", str(other),
              "--out", str(tmp_path / "m"))
    assert out.returncode == 2 and "another prompt set" in out.stdout + out.stderr


@pytest.mark.parametrize("text", ["3/3", "-1/3", "1/0", "a/b", "1", "1/2/3"])
def test_a_shard_spec_outside_0_le_i_lt_n_is_bad_input(text):
    with pytest.raises(InputError):
        Shard.parse(text)


@given(st.lists(st.text(min_size=1, max_size=4), min_size=0, max_size=40, unique=True), st.integers(1, 9))
def test_the_shards_partition_the_set_and_order_rebuilds_it(ids, n):
    parts = [Shard(i, n).ids(ids) for i in range(n)]
    assert sorted(x for p in parts for x in p) == sorted(ids)
    assert order(parts) == ids


def test_a_captured_reference_shards_and_merges_with_its_determinism(made, tmp_path, monkeypatch):
    """`capture --shard`: K runs per prompt, one shard each; merged, the records and the
    determinism summary are the unsharded capture's."""
    where = tmp_path / "c"
    shutil.copytree(made, where, ignore=shutil.ignore_patterns("merged", "reports", "shard*", "whole"))
    monkeypatch.chdir(where)
    Path("cap.toml").write_text('name = "cap"\nprompts = "p.jsonl"\nmax_tokens = 4\ntop_logprobs = 5\n'
                                '[reference]\nkind = "command"\ncommand = ["python", "engine.py"]\nmodel = "toy"\n')
    for args in (("--shard", "0/2", "--out", "c0"), ("--shard", "1/2", "--out", "c1"), ("--out", "call")):
        out = cli("capture", "cap.toml", "--runs", "2", *args, cwd=where)
        assert out.returncode == 0, out.stdout + out.stderr
    out = cli("merge", "c1", "c0", "--out", "cm", "-p", "p.jsonl", cwd=where)
    assert out.returncode == 0, out.stdout + out.stderr
    assert records(Path("cm")) == records(Path("call"))
    det = [json.loads(Path(d, "manifest.json").read_text())["determinism"] for d in ("cm", "call")]
    assert det[0] == det[1] and det[0]["runs"] == 2 and det[0]["prompts_total"] == N_PROMPTS
