"""Issue 50, item 5: a prompt whose near-tie diverges later fails the gate, yet its last line said
"nothing divergent to localise: every flip is a near-tie", and `localize = true` skipped it. The
later divergence is named and is what localisation targets (the position that is divergent, on
the candidate's own prefix, not the near-tie before it)."""

from __future__ import annotations

from pathlib import Path

from helpers import cascade_gate, confident, rec
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.judge.cascade import Cascade, Later, LaterPosition
from strict_gate.judge.compare import Comparison, Divergence, PromptComparison, Status, Summary
from strict_gate.localize.config import Scope
from strict_gate.localize.next_step import NOTHING_DIVERGENT
from strict_gate.localize.run import targets

ENGINE = Path(__file__).parent / "engines" / "cascade_engine.py"


def test_the_last_line_names_a_near_ties_later_divergence(tmp_path, monkeypatch):
    """A near-tie at position 2, then a token the reference ranks far below its argmax at 3."""
    monkeypatch.chdir(tmp_path)
    cascade_gate(Path("."), "later")
    result = CliRunner().invoke(app, ["gate", "gate.toml"], terminal_width=400)
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1].strip()
    assert NOTHING_DIVERGENT not in result.output
    assert last.startswith("next: strict-gate show reports/") and "--prompt p0 (its near-tie diverges later, at " \
        "position 3)" in last, last


def _near_tie_then_divergent() -> tuple[Comparison, dict, dict, dict]:
    """p0: a near-tie at 1 (reference 7, candidate 8), then the candidate's 9 at 3 where the
    reference's argmax on the candidate's prefix is 4, beyond the band."""
    ref = rec("p0", [5, 7, 6, 6], prompt=(1, 2), tops=[confident(t) for t in (5, 7, 6, 6)])
    cand = rec("p0", [5, 8, 6, 9], prompt=(1, 2), tops=[confident(t) for t in (5, 8, 6, 9)])
    d = Divergence(position=1, reference_token=7, candidate_token=8, reference_gap=0.01, candidate_gap=0.01,
                   reference_margin=0.01, reason="both gaps within [0, band 0.5]")
    pc = PromptComparison("p0", Status.NEAR_TIE, d, 1, 1, 4, 4)
    comparison = Comparison(0.5, (pc,), Summary(1, 0, 4, 1, 1, {"near_tie": 1}))
    lp = LaterPosition(3, 9, 4, 6.0, None, None, Later.DIVERGENT, "reference re-scored |gap| 6 > band 0.5")
    later = {"p0": Cascade(first=1, end=4, judged=2, divergent=(lp,), divergent_count=1, worst_gap=6.0)}
    return comparison, {"p0": ref}, {"p0": cand}, later


def test_localize_true_targets_a_near_ties_later_divergence_on_the_candidates_prefix():
    comparison, refs, cands, later = _near_tie_then_divergent()
    (t,) = targets(comparison, refs, n=2, statuses=Scope.DIVERGENT.statuses, later=later, cand_records=cands)
    assert t.prompt_id == "p0" and t.token_ids == (1, 2, 5, 8, 6, 9)  # the candidate's prefix, through position 3
    assert t.positions == (3, 4) and t.tokens == (("reference", 4), ("candidate", 9))  # logits at 4 chose token 3
    assert targets(comparison, refs, n=2, statuses=Scope.DIVERGENT.statuses) == []  # a plain near-tie is not divergent
