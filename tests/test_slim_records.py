"""What compare keeps of a record once judged (runs/slim.py): the small fields in memory, the ids
in an unlinked spill file. A record looked up afterwards must be the record read whole, every
field (prompt ids, tokens, samples, timing, error), and the spill must leave no file behind."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from test_adversarial_topk_text import _record, _write_run

from strict_gate.judge import compare_runs as compare_mod
from strict_gate.offline.compare import compare_run_dirs
from strict_gate.runs.reader import read_records
from strict_gate.runs.slim import Spill

N = 12


def _with_extras(i: int) -> str:
    rec = json.loads(_record(i))
    rec["prompt_token_ids"] = list(range(3 + i))  # lengths differ record to record
    rec["timing"] = {"ttft_s": 0.01 * i, "total_s": 0.5 + i}
    rec["samples"] = [rec["token_ids"], rec["token_ids"][:-1] + [7 + i]]
    return json.dumps(rec, separators=(",", ":"))


def test_a_record_looked_up_after_compare_is_the_record_read_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", 2_000)
    lines = [_with_extras(i) for i in range(N)]
    for d in (Path("ref"), Path("cand")):
        _write_run(d, lines, N)
    result = compare_run_dirs("ref", "cand")
    whole = read_records(Path("ref/records.jsonl"))
    for pid, rec in whole.items():
        got = result.reference_records[pid]
        assert (got.prompt_token_ids, got.token_ids, got.samples, got.finish_reason, got.timing, got.error) == \
            (rec.prompt_token_ids, rec.token_ids, rec.samples, rec.finish_reason, rec.timing, rec.error), pid
        assert [tuple(s) for s in got.top_logprobs] == [tuple(s) for s in rec.top_logprobs]
    assert result.determinism is not None and result.determinism["prompts_deterministic"] == 0


def test_the_spill_reads_back_what_it_was_given_and_leaves_no_file():
    before = set(Path(tempfile.gettempdir()).glob("strict-gate-ids-*"))
    spill = Spill()
    seqs = [[], [0, 1, 2**31 - 1], list(range(600))]
    at = [spill.put(seqs[:1]), spill.put(seqs[1:])]
    assert spill.get(at[0], [0]) == [()]
    assert spill.get(at[1], [3, 600]) == [tuple(s) for s in seqs[1:]]
    assert set(Path(tempfile.gettempdir()).glob("strict-gate-ids-*")) == before  # unlinked from the start


def test_an_id_beyond_int32_is_refused_not_wrapped():
    """The audit bounds ids to 0..2**31-1 before a record is kept; past that the spill refuses, never wraps."""
    with pytest.raises(OverflowError):
        Spill().put([[2**31]])
