"""The gate asks engines what they can do (capability flags, tokenizer_file()), never which
kind they are: a new engine that replays runs, or has a tokenizer.json, needs no gate edit."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from strict_gate.engines import ENGINES, engine_class
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.hf import HFEngine, HFOptions
from strict_gate.engines.openai.engine import OpenAIEngine, OpenAIOptions
from strict_gate.engines.recorded import RecordedEngine, RecordedOptions
from strict_gate.speed.ladder import token_space

PACKAGE = Path(__file__).resolve().parent.parent / "strict_gate"
TINY = PACKAGE / "models" / "tiny-llama"


def _strings(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_strings(e) for e in node.elts)


def kind_checks(source: str) -> list[int]:
    """Lines comparing something's `.kind` with a string (== "recorded", in ("hf", ...))."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides) and any(map(_strings, sides)):
                lines.append(node.lineno)
    return lines


def test_the_check_finds_a_kind_comparison():
    assert kind_checks('if arm.kind == "recorded":\n    pass\n') == [1]
    assert kind_checks('x = ref.kind not in ("hf", "vllm")\n') == [1]
    assert kind_checks("x = ref.replays_run and p.kind is not q.kind\n") == []


def test_no_module_asks_an_engine_which_kind_it_is():
    found = {str(p.relative_to(PACKAGE)): kind_checks(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_only_a_stored_run_replays_and_cannot_be_timed():
    flags = {kind: (engine_class(kind).replays_run, engine_class(kind).measurable) for kind in ENGINES}
    assert flags == {kind: (kind == "recorded", kind != "recorded") for kind in ENGINES}


def test_tokenizer_file_is_the_one_each_engine_tokenizes_with(tmp_path):
    tok = TINY / "tokenizer.json"
    assert HFEngine(HFOptions(model="bundled:tiny-llama")).tokenizer_file() == tok
    assert CommandEngine(CommandOptions(command=["x"], tokenizer=str(TINY))).tokenizer_file() == tok
    assert CommandEngine(CommandOptions(command=["x"], model=str(TINY))).tokenizer_file() == tok  # a model dir
    assert CommandEngine(CommandOptions(command=["x"], model="served-name")).tokenizer_file() is None
    assert OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:1", tokenizer=str(tok))).tokenizer_file() == tok
    assert OpenAIEngine(OpenAIOptions(base_url="http://127.0.0.1:1")).tokenizer_file() is None
    assert RecordedEngine(RecordedOptions(path=str(tmp_path), model="bundled:tiny-llama")).tokenizer_file() is None


@pytest.mark.parametrize("engine", ["hf", "command"])
def test_the_ladder_draws_from_the_vocabulary_of_the_tokenizer_file(engine):
    eng = (HFEngine(HFOptions(model="bundled:tiny-llama")) if engine == "hf"
           else CommandEngine(CommandOptions(command=["x"], tokenizer=str(TINY))))
    space = token_space([RecordedEngine(RecordedOptions(path="nowhere")), eng])
    config = json.loads((TINY / "config.json").read_text())
    assert space is not None and space.vocab_size == config["vocab_size"]
    assert config["eos_token_id"] in space.avoid and config["bos_token_id"] in space.avoid
