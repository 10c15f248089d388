"""One continuation judge (issue 49, item 4): what follows a flip is judged by the gate's cascade
rule (judge/cascade.py) in every arm that meets one, and a stopped or shorter output after a flip
leaves positions unjudged: never a pass.

Hostile engines are real processes (tests/engines/): variant_engine.py flips a near-tie when
requests share a batch and then stops; hostile_speed_engine.py flips only on the speed arm's
timed requests, then emits garbage or stops; the fake OpenAI server's text-only mode flips a
near-tie of the committed baseline and stops there. Each gate runs as a user runs it: from its
own directory, relative paths, `strict-gate gate gate.toml`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import write_gate
from typer.testing import CliRunner

from strict_gate.cli import app

ROOT = Path(__file__).resolve().parents[1]
ENGINES = Path(__file__).parent / "engines"
runner = CliRunner()


def _gate(*args: str) -> tuple[int, str, dict]:
    """`strict-gate gate gate.toml` in the working directory, and its report.json."""
    result = runner.invoke(app, ["gate", "gate.toml", *args], terminal_width=200)
    assert list(Path("out").glob("*/report.json")), result.output
    (report,) = Path("out").glob("*/report.json")
    return result.exit_code, result.output, json.loads(report.read_text())


# ---------------------------------------------------------------------------- invariance


def _invariance_gate(tmp_path: Path, monkeypatch, *flags: str) -> None:
    """Both arms agree at batch 1; the candidate's batch-4 variant flips a 0.1-nat near-tie at
    position 2 (band 0.5) and then does what `flags` say."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ENGINES / "variant_engine.py", "variant_engine.py")
    Path("p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7]}) + "\n"
                                       for i in range(4)))
    write_gate(Path("."), name="cont", prompts="p.jsonl", max_tokens=8, top_logprobs=2, policy="strict", band=0.5,
               output_dir="out", reference={"kind": "command", "command": ["python", "variant_engine.py"]},
               candidate={"kind": "command", "command": ["python", "variant_engine.py", "--mode", "in_flight",
                                                         "--gap", "0.1", *flags]},
               invariance={"batch": [4], "policy": "near-tie"})


@pytest.mark.parametrize(("flags", "stopped"), [
    (("--stop", "2"), "stopped after 3 of 8 tokens"),  # on the flip itself: nothing after it was re-scored
    (("--stop", "3", "--score"), "stopped after 4 of 8 tokens"),  # one later token judged, then the stop
])
def test_a_batch_variant_that_flips_then_stops_is_never_invariant(tmp_path, monkeypatch, flags, stopped):
    """The variant flips a near-tie and stops (finish "stop", an ordinary token, no end-of-sequence
    id) where the batch-1 run went on to 8 tokens: the positions it never emitted are unjudged, as
    the gate's own cascade rule says of a candidate, so the variant is incomplete: exit 3."""
    _invariance_gate(tmp_path, monkeypatch, *flags)
    code, out, report = _gate()
    assert code == 3, out  # before: INVARIANT, exit 0
    assert report["verdict"] == "pass"  # the arms agree at batch 1
    (variant,) = report["invariance"]["variants"]
    assert variant["verdict"] == "incomplete"
    assert any(stopped in p and "where the batch-1 run may have gone on" in p for p in variant["problems"]), \
        variant["problems"]
    assert "INVARIANT," not in out.replace("NOT INVARIANT", "")
