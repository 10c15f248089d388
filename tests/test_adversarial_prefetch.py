"""compare reads both runs a chunk ahead in two threads (runs/prefetch.py): a hostile file must
end it exactly as the serial reader ends it: the first bad line in reading order (a chunk's
reference before its candidate, chunk by chunk) named with its file and line, exit 2, and the
cyclic collector left as it was. Runs are read through relative paths from a working directory."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from test_adversarial_topk_text import _record, _write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.errors import InputError
from strict_gate.judge import compare_runs as compare_mod
from strict_gate.judge.compare_runs import compare_runs
from strict_gate.offline.compare import compare_run_dirs
from strict_gate.runs.reader import read_records

N = 40


def _runs(ref_bad: dict[int, str], cand_bad: dict[int, str]) -> None:
    for d, bad in ((Path("ref"), ref_bad), (Path("cand"), cand_bad)):
        _write_run(d, [bad.get(i, _record(i)) for i in range(N)], N)


@pytest.fixture
def small_chunks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", 3_000)  # a few records a chunk: 10+ chunks in flight order


@pytest.mark.parametrize("ref_line, cand_line, want", [
    (31, 6, ("cand/records.jsonl", 6)),  # the candidate's chunk comes first
    (6, 6, ("ref/records.jsonl", 6)),  # the same chunk: the reference is read first
    (6, 31, ("ref/records.jsonl", 6)),
    (None, 39, ("cand/records.jsonl", 39)),  # in the last chunk, after every other was read ahead
])
def test_the_first_bad_line_in_reading_order_is_the_one_named(small_chunks, ref_line, cand_line, want):
    broken = '{"id": "p%d", "token_ids": [1, 2'  # not JSON
    _runs({ref_line - 1: broken % (ref_line - 1)} if ref_line else {},
          {cand_line - 1: broken % (cand_line - 1)})
    was = gc.isenabled()
    with pytest.raises(InputError) as e:
        compare_run_dirs("ref", "cand")
    assert (e.value.path, e.value.line) == want
    assert gc.isenabled() == was


def test_a_bad_line_is_exit_2_with_file_and_line_through_the_cli(small_chunks):
    _runs({}, {20: '{"id": "p20", "token_ids": "x"}'})
    result = CliRunner().invoke(app, ["compare", "ref", "cand", "--out", "out"])
    assert result.exit_code == 2, result.output
    assert "cand/records.jsonl" in result.output and "21" in result.output
    assert "Traceback" not in result.output


def test_read_ahead_gives_the_in_memory_comparison(small_chunks):
    """Every prompt's result equals compare_runs over the records read whole, in order."""
    cand = {i: _record(i) for i in range(N)}
    for i in (3, 17, 38):  # the candidate takes the runner-up from position 2 on
        rec = json.loads(_record(i))
        for row in rec["top_logprobs"][2:]:  # the ids trade places, the logprobs stay sorted
            row[0][0], row[1][0] = row[1][0], row[0][0]
        rec["token_ids"][2:] = [row[0][0] for row in rec["top_logprobs"][2:]]
        cand[i] = json.dumps(rec, separators=(",", ":"))
    _runs({}, cand)
    streamed = compare_run_dirs("ref", "cand").comparison
    whole = compare_runs(read_records(Path("ref/records.jsonl")), read_records(Path("cand/records.jsonl")),
                         prompt_ids=[f"p{i}" for i in range(N)])
    def seen(c):
        return [(p.id, p.status, p.matched_positions, None if (d := p.first_divergence) is None else
                 (d.position, d.reference_token, d.candidate_token, d.reference_gap, d.candidate_gap,
                  d.reference_top, d.candidate_top)) for p in c.prompts]

    assert seen(streamed) == seen(whole)
    assert {p.id for p in streamed.prompts if p.status != "match"} == {"p3", "p17", "p38"}
    assert gc.isenabled()
