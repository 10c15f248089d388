"""Issue 50, item 8: the acceptance rule `near-ties-only` read each prompt's first flip alone, so
a gate whose near-ties go on to 20 divergent later positions met it. Later positions count."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import acceptance_table as at  # benchmarks/ is put on the path above

PATTERNS = at.load_table(ROOT / "benchmarks" / "acceptance.toml").scan.patterns


def _report(where: Path, later: dict | None) -> Path:
    """A report of 128 prompts, 111 exact and 17 near-ties at their first flip; `later`: its later totals."""
    where.mkdir(parents=True)
    doc = {"notes": [], "prompts": [], "summary": {"prompts_exact": 111, "prompts_total": 128, "counts": {
        "near_tie": 17, "divergent": 0, "error": 0, "missing": 0}}}
    if later is not None:
        doc["later"] = later
    (where / "report.json").write_text(json.dumps(doc), encoding="utf-8")
    return where


def _row() -> at.Step:
    row = at.Step(id="g", tier="fast", command="strict-gate gate gates/g.toml", exit=1, rule="near-ties-only")
    return msgspec.convert(msgspec.to_builtins(row), at.Step)


def test_near_ties_only_fails_a_gate_with_20_later_divergent_positions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = _report(Path("reports/g-1"), {"prompts_flipped": 17, "later_divergent": 20, "prompts_divergent_later": 3})
    unmet = at.check(_row(), at.Outcome(1, "", d, 1.0), PATTERNS)
    assert "rule near-ties-only: later_divergent = 20, expected 0" in unmet


def test_near_ties_only_needs_the_later_totals_to_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    absent = _report(Path("reports/old"), None)
    assert "rule near-ties-only: later_divergent = absent, expected 0" in at.check(
        _row(), at.Outcome(1, "", absent, 1.0), PATTERNS)
    clean = _report(Path("reports/clean"), {"prompts_flipped": 17, "later_divergent": 0})
    assert at.check(_row(), at.Outcome(1, "", clean, 1.0), PATTERNS) == []
