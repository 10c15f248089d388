"""The table printed at the end of a gate fits an 80-column terminal: one line per prompt,
the id, status and position never cut, no empty column."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from strict_gate.judge.compare import Status
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.offline.compare import compare_run_dirs
from strict_gate.report.console import _SHORT_STATUS, print_result

BASELINES = Path(__file__).resolve().parent.parent / "baselines"


def printed(result, width: int = 80) -> list[str]:
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=width, color_system=None), report_dir="reports/x")
    return buf.getvalue().splitlines()


def test_the_gate_table_fits_80_columns_without_cutting_key_cells():
    result = compare_run_dirs(BASELINES / "tiny-llama-vllm-fp32", BASELINES / "tiny-llama-vllm-bf16",
                              policy="strict", band=0.1)
    bad = [p for p in result.comparison.prompts if p.status != Status.MATCH]
    # Half the divergent prompts get a teacher-forced diagnosis; one prompt turns into an error.
    diagnoses = {
        p.id: Diagnosis(p.id, p.first_divergence.position, p.first_divergence.reference_gap, 0.3 if i % 2 else None,
                        1, i % 2 == 0, () if i % 2 == 0 else (p.first_divergence.position + 1,), (), "v",
                        near_tie=False)
        for i, p in enumerate(bad) if p.status == Status.DIVERGENT
    }
    errored = replace(bad[0], status=Status.ERROR, first_divergence=None,
                      detail="candidate failed: RuntimeError: " + "a very long engine error " * 10)
    prompts = tuple(errored if p.id == errored.id else p for p in result.comparison.prompts)
    result = replace(result, diagnoses=diagnoses, comparison=replace(result.comparison, prompts=prompts))
    lines = printed(result)
    assert max(len(line) for line in lines) <= 80
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("prompt "))
    shown = [p for p in prompts if p.status != Status.MATCH]
    body = lines[header + 2: header + 2 + len(shown)]
    for line, p in zip(body, shown):  # one line per prompt, in order: nothing wrapped
        cells = line.split()
        d = p.first_divergence
        assert cells[:3] == [p.id, _SHORT_STATUS.get(p.status, p.status), "–" if d is None else str(d.position)]
        assert len(line.rstrip()) > 60  # the why column is filled
    whys = [line.rstrip()[line.rstrip().rindex("  "):].strip() for line in body]
    assert whys[0].startswith("candidate failed: ") and whys[0].endswith("…")
    assert "off top-k; rest follows" in whys and any(w.startswith("real; again at ") for w in whys)
    assert "within band" in whys and "gap > band" not in whys  # every divergent prompt got its diagnosis
    assert lines[header + 2 + len(shown)].strip() == ""  # the table ends after the last prompt
