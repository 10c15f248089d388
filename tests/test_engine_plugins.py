"""Engines other packages register under the `strict_gate.engines` entry-point group: found through
real package metadata (a dist-info folder on sys.path), built by the registry, refused on a clash
with a built-in, and listed when a kind is unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from strict_gate.engines import ENGINES, Engine, PromptInput, engine_class, plugin_engines
from strict_gate.engines.hf import HFEngine
from strict_gate.engines.protocols import CAPABILITIES, EngineCore
from strict_gate.errors import ConfigError
from strict_gate.gate.config import parse_gate_config
from strict_gate.runs.records import Sampling

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "engines"


def install(tmp_path: Path, monkeypatch, **entries: str) -> None:
    """A distribution whose entry_points.txt registers `entries`, visible to importlib.metadata."""
    site = tmp_path / "site"
    dist = site / "toy_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[strict_gate.engines]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items()))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(site))


def test_a_registered_plugin_is_built_from_a_gate_config(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, toy="plugin_engine:ToyEngine")
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "text": "hi"}\n')
    cfg = parse_gate_config(
        'name = "toy"\nprompts = "prompts.jsonl"\nmax_tokens = 3\ntop_logprobs = 2\n'
        '[reference]\nkind = "toy"\nseed = 5\n[candidate]\nkind = "toy"\n',
        str(tmp_path / "gate.toml"))
    engine = cfg.reference.build()
    assert isinstance(engine, Engine) and type(engine).__name__ == "ToyEngine" and engine.options.seed == 5
    with engine:
        engine.start()
        (record,) = engine.generate([PromptInput("a", tuple(engine.tokenize("hi")))], Sampling(3, 2))
    assert len(record.token_ids) == 3 and record.error is None
    assert [s.token_id for s in engine.score(record.prompt_token_ids, record.token_ids, 2)] == list(record.token_ids)
    assert "toy" not in ENGINES and "toy" in plugin_engines()


def test_a_plugin_clashing_with_a_built_in_is_refused_naming_both(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, hf="plugin_engine:ToyEngine")
    assert engine_class("hf") is HFEngine  # the built-in wins: its kind never reads plugins
    with pytest.raises(ConfigError) as e:
        engine_class("toy")
    msg = str(e.value)
    assert "'plugin_engine:ToyEngine' from toy-plugin" in msg and ENGINES["hf"] in msg and "built-in wins" in msg


def test_an_unknown_kind_lists_the_plugin_kinds(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, toy="plugin_engine:ToyEngine")
    with pytest.raises(ConfigError, match=r"unknown engine kind 'toyy'; did you mean 'toy'\? "
                                          r"\(known: command, hf, openai, recorded, vllm; plugins: toy\)"):
        engine_class("toyy")


def test_a_plugin_that_is_not_an_engine_is_refused(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, notone="plugin_engine:ToyOptions")
    with pytest.raises(ConfigError, match="'notone'.*not a strict_gate.engines.Engine subclass"):
        engine_class("notone")


def test_every_built_in_satisfies_the_core_and_the_capability_protocols():
    assert len([m for m in vars(EngineCore) if not m.startswith("_")]) == 5
    for kind in ENGINES:
        cls = engine_class(kind)
        for proto in (EngineCore, *CAPABILITIES):
            missing = [m for m in vars(proto) if not m.startswith("_") and not hasattr(cls, m)]
            assert not missing, f"{kind} lacks {proto.__name__}'s {missing}"
