"""Comparing runs streamed from disk (runs/stream.py): the same result as the in-memory path
for shuffled and incomplete runs, the audit as strict in every chunk, and memory bounded.

The runs are the synthetic ones benchmarks/scale.py writes (greedy, sorted, 10% diverging)."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from strict_gate.errors import InputError
from strict_gate.gate.judgement import judge
from strict_gate.judge import compare_runs as compare_mod
from strict_gate.judge.result import to_json
from strict_gate.judge.spec import GateSpec, PromptSetRef
from strict_gate.offline.compare import compare_run_dirs
from strict_gate.runs.reader import load_run

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "benchmarks" / "scale.py")
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)


def _in_memory(ref_dir: Path, cand_dir: Path) -> dict:
    """The result as the reader that holds both runs whole computes it."""
    ref, cand = load_run(ref_dir, allow_incomplete=True), load_run(cand_dir, allow_incomplete=True)
    spec = GateSpec(name=f"{ref_dir.name}-vs-{cand_dir.name}",
                    prompt_set=PromptSetRef.stored(dict(ref.manifest.prompt_set), ref.manifest.prompt_ids),
                    sampling=ref.manifest.sampling, policy="auto", band=0.5)
    result = judge(spec, ref, cand)
    return _comparable(to_json(result))


def _comparable(report: dict) -> dict:
    report.pop("created")
    return report


def _rewrite(run: Path, keep) -> list[str]:
    """Keep (and reorder) the records of a run as `keep(lines)` says; the manifest follows."""
    path = run / "records.jsonl"
    lines = keep(path.read_text().splitlines())
    path.write_text("".join(line + "\n" for line in lines))
    m = json.loads((run / "manifest.json").read_text())
    m["records"] = len(lines)
    (run / "manifest.json").write_text(json.dumps(m))
    return lines


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(compare_mod, "CHUNK_BYTES", 20_000)  # a few prompts a chunk: many chunks
    return scale.write_runs(tmp_path, 40, 24, 5, diverge=0.3, seed=3)


def test_shuffled_order_compares_as_in_memory(runs):
    ref, cand = runs
    _rewrite(cand, lambda lines: random.Random(1).sample(lines, len(lines)))
    _rewrite(ref, lambda lines: lines[::-1])
    streamed = _comparable(to_json(compare_run_dirs(ref, cand)))
    assert streamed == _in_memory(ref, cand)
    assert [p["id"] for p in streamed["prompts"]] == [f"p{i:06d}" for i in range(40)]  # prompt order, not file order
    assert streamed["summary"]["counts"]["match"] < 40


def test_missing_prompts_compare_as_in_memory(runs):
    ref, cand = runs
    _rewrite(cand, lambda lines: lines[5:])  # the candidate lacks p000000..p000004
    _rewrite(ref, lambda lines: [ln for i, ln in enumerate(lines) if i % 7])  # the reference lacks every 7th
    result = compare_run_dirs(ref, cand)
    assert _comparable(to_json(result)) == _in_memory(ref, cand)
    assert result.comparison.summary.counts["missing"] == 5 + 5  # p0 lacks both, counted once
    assert result.verdict.verdict != "pass"


def test_records_read_back_equal_the_whole_run(runs):
    """The result's records (slim, whole or decoded on demand) equal what load_run reads."""
    ref, cand = runs
    result = compare_run_dirs(ref, cand)
    whole = load_run(cand).records
    assert len(result.candidate_records) == len(whole)
    for rid, rec in whole.items():
        got = result.candidate_records[rid]
        assert (got.token_ids, got.prompt_token_ids, got.timing, got.finish_reason) == (
            rec.token_ids, rec.prompt_token_ids, rec.timing, rec.finish_reason)
        assert got.top_logprobs == rec.top_logprobs


def test_a_bad_record_in_a_late_chunk_names_its_line(runs):
    ref, cand = runs
    lines = (cand / "records.jsonl").read_text().splitlines()
    rec = json.loads(lines[33])
    rec["top_logprobs"][2] = rec["top_logprobs"][2][::-1]  # step 2 ascending: breaks rule sorted
    lines[33] = json.dumps(rec)
    (cand / "records.jsonl").write_text("".join(line + "\n" for line in lines))
    with pytest.raises(InputError, match="rule sorted") as e:
        compare_run_dirs(ref, cand)
    assert e.value.line == 34 and e.value.path.endswith("records.jsonl")


def test_a_record_outside_the_prompt_set_is_audited_too(runs):
    ref, cand = runs
    rec = json.loads((cand / "records.jsonl").read_text().splitlines()[0])
    rec["id"], rec["finish_reason"] = "stray", "eos"  # not a finish reason
    with open(cand / "records.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    m = json.loads((cand / "manifest.json").read_text())
    m["records"] += 1
    (cand / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="rule finish-reason") as e:
        compare_run_dirs(ref, cand)
    assert e.value.line == 41


def test_a_file_changed_after_indexing_is_refused(runs):
    from strict_gate.runs.stream import open_run

    ref, _ = runs
    run = open_run(ref)
    with open(ref / "records.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(InputError, match="changed while it was being read"):
        run.records.read(["p000001"])


PEAK_RSS_MB = 300  # the reader that held both runs whole peaked at about 460 MB on this pair


def test_compare_memory_is_bounded(tmp_path):
    """200 x 512 x 20 (116 MB of JSONL): the peak RSS of a child process running compare and
    every report stays under PEAK_RSS_MB (imports alone take about 100 MB)."""
    ref, cand = scale.write_runs(tmp_path, 200, 512, 20)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so a child of a large
    # pytest process would report the parent's pages; VmHWM belongs to the child's own memory map.
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from strict_gate.offline.compare import compare_run_dirs\n"
        "r = compare_run_dirs(sys.argv[1], sys.argv[2], out=Path(sys.argv[3]))\n"
        "assert r.comparison.summary.prompts_total == 200\n"
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(int(hwm.split()[1]) // 1024)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(ref), str(cand), str(tmp_path / "out")],
                       capture_output=True, text=True, check=True)
    peak = int(p.stdout.strip().splitlines()[-1])
    assert (tmp_path / "out" / "report.html").exists()
    print(f"peak RSS {peak} MB")
    assert peak < PEAK_RSS_MB, f"peak RSS {peak} MB"
