"""The golden's votes at every [invariance] variant's first moved position (issue 52): each format
shows them, `show` reads them back, and a golden that sides with the variant's token on the
REFERENCE arm is named as vLLM issue 40956's signal. Real command engines
(tests/engines/variant_engine.py), the CLI, a working directory with relative paths.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import section
from test_adversarial_golden import _variant_gate
from typer.testing import CliRunner

from strict_gate.cli import app


def test_the_golden_votes_at_each_variant_move_in_every_format(tmp_path, monkeypatch):
    """The golden is the arms' own model: at each move (token 2, both arms) it sides with batch-1,
    the variant's token 3 nats below (the engine's gap)."""
    code, out, report = _variant_gate(tmp_path, monkeypatch)
    assert code == 0, out
    vv = section(report, "golden")["variant_votes"]
    assert vv["moves"] == 6 and vv["verdict"] == "informational" and len(vv["votes"]) == 6
    for v in vv["votes"]:
        assert v["side"] == "batch-1" and v["position"] == 2 and v["variant"] == "chunked_prefill-2"
        assert v["golden_argmax"] == v["batch1_token"] != v["variant_token"]
        assert v["batch1_gap"] == 0 and abs(v["variant_gap"] - 3.0) < 1e-9
    head = "variants: 6 move(s), golden with batch-1 at 6, with the variant at 0, neither 0"
    assert head in vv["headline"] and head in out and "REFERENCE" not in vv["headline"]
    (d,) = sorted(p for p in Path("reports").iterdir() if p.is_dir())
    md, html, junit = ((d / f).read_text() for f in ("report.md", "report.html", "junit.xml"))
    assert "### The golden at the variants' moves" in md and "| reference | chunked\\_prefill-2 | p1 | 2 |" in md
    assert "The golden at the variants' moves" in html and 'name="golden_variants_verdict" value="informational"' in junit
    shown = " ".join(CliRunner().invoke(app, ["show", str(d)], terminal_width=200).output.split())
    assert head in shown and "golden at reference:chunked_prefill-2: p0: position 2: the golden sides with batch-1" in shown


def test_a_golden_on_the_variants_token_on_the_reference_arm_is_named(tmp_path, monkeypatch):
    """A golden whose argmax is the arms' runner-up, the variant's token (--shift 1; the batch-1
    token outside its top-k, scored -20 where the golden scored it): on the reference arm that says its own variant is right and its batch-1 run
    wrong. Informational: the exit code stays 0."""
    code, out, report = _variant_gate(tmp_path, monkeypatch, "--shift", "1")
    assert code == 0, out
    vv = section(report, "golden")["variant_votes"]
    assert all(v["side"] == "variant" and v["variant_gap"] == 0 and abs(v["batch1_gap"] - 19.9) < 1e-9
               for v in vv["votes"])
    assert ("on the REFERENCE arm the golden sides with the variant's token, the batch-1 token beyond the band 0.5, "
            "at 3 move(s) (chunked_prefill-2): the reference's own variant is right and its batch-1 run wrong") \
        in vv["headline"]
    assert "the REFERENCE's own variant is right, its batch-1 run wrong" in out
    assert report["exit_code"] == 0 and report["features"]["golden"]["verdict"] == "informational"
    assert json.loads(json.dumps(vv)) == vv


def test_a_reference_move_the_golden_splits_within_the_band_is_a_near_tie_not_the_signal():
    """The H100 run's case (benchmarks/results/gpu-vllm-session5): bf16 near-ties on vLLM's own
    prefill cuts, the golden on the variant's side by 0.003 nats. The signal needs the batch-1
    token beyond the band; within it the line says near-tie and never that a run is wrong."""
    from strict_gate.golden.variants import MoveVote, VariantVotes
    from strict_gate.golden.vote import Vote

    near = MoveVote("reference", "prefill-cut-16", "p1", 3, Vote(3, 7, 5, 7, 0.003, 0.0))
    far = MoveVote("reference", "prefill-cut-16", "p2", 1, Vote(1, 7, 5, 7, 0.9, 0.0))
    vv = VariantVotes(64, 2, (near, far), 0.5)
    assert vv.reference_right_in_variant == (far,) and vv.reference_near_ties == (near,)
    assert "at 1 move(s) (prefill-cut-16)" in vv.headline()
    assert "1 move(s) side with the variant within the band 0.5: near-ties, neither run wrong" in vv.headline()
    assert "wrong" not in near.line(0.5).replace("neither run is wrong", "")
    assert "its batch-1 run wrong" in far.line(0.5)
    only_near = VariantVotes(64, 1, (near,), 0.5)
    assert "40956" not in only_near.headline() and "is right" not in only_near.headline()
