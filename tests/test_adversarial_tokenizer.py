"""An engine that cannot tokenize the gate's text prompts (issue 50, item 2): exit 2 naming the
gate config's file and the line of the arm's table, as every other config error does.

The gate runs from the user's directory with relative paths; the command engine is never started
(tokenizing comes first), so no engine process is involved.
"""

from __future__ import annotations

import json
import sys

import pytest
from helpers import write_gate
from typer.testing import CliRunner

from strict_gate.cli import app


def _arm(**options) -> dict:
    return {"kind": "command", "command": [sys.executable, "engine.py"], **options}


@pytest.mark.parametrize("options, words", [
    ({}, "cannot tokenize text prompts without `tokenizer`"),
    ({"tokenizer": "no-such-tokenizer"}, "tokenizer 'no-such-tokenizer' not found"),
])
def test_a_reference_without_its_tokenizer_is_named_at_its_table(tmp_path, monkeypatch, options, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": "a", "text": "hello there"}) + "\n")
    write_gate(tmp_path, reference=_arm(**options), candidate=_arm(), prompts="prompts.jsonl", max_tokens=4,
               top_logprobs=2, diagnose=False)
    line = (tmp_path / "gate.toml").read_text().splitlines().index("[reference]") + 1
    r = CliRunner().invoke(app, ["gate", "gate.toml"], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert f"gate.toml:{line}: command: {words}" in r.output  # before: the message alone, no file, no line
