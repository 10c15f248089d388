"""Hostile `dump` replies: a real engine process over the command protocol that writes what it
should not. Each is refused as an engine failure naming the rule it breaks (DumpRule).

The engine is a short Python script (no model): it answers the hello and every dump with the
reply its MODE environment variable picks.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from strict_gate.engines.base import DumpRequest
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.errors import EngineError
from strict_gate.localize.capture import DumpError, DumpRule, capture

pytest.importorskip("safetensors")
pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    from safetensors.torch import save_file
    mode = os.environ["MODE"]
    print(json.dumps({"hello": "strict-gate/engine@1", "capabilities": ["generate", "dump"]}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "shutdown":
            break
        n, d = len(req["positions"]), req["directory"]
        good = {"embed": torch.ones(n, 4), "layers.0": torch.ones(n, 4)}
        path, points = os.path.join(d, "a.safetensors"), sorted(good)
        if mode == "outside":
            path = os.path.join(os.path.dirname(d), "elsewhere.safetensors")
        elif mode == "symlink":
            target = os.path.join(os.path.dirname(d), "real.safetensors")
            save_file(good, target)
            os.symlink(target, path)
        elif mode == "nan":
            good["layers.0"][0, 0] = float("nan")
        elif mode == "shape":
            good["layers.0"] = torch.ones(n + 1, 4)
        elif mode == "float16":
            good["layers.0"] = good["layers.0"].half()
        elif mode == "unasked":
            good["norm"] = torch.ones(n, 4)
            points = sorted(good)
        elif mode == "unknown":
            good["layers.0.ffn"] = torch.ones(n, 4)
            points = sorted(good)
        elif mode == "lies":
            points = ["embed"]
        elif mode == "garbage":
            open(path, "wb").write(b"not a safetensors file")
        elif mode == "no_path":
            print(json.dumps({"id": req["id"], "points": points}), flush=True)
            continue
        if mode not in ("outside", "symlink", "garbage"):
            save_file(good, path)
        elif mode == "outside":
            save_file(good, path)
        print(json.dumps({"id": req["id"], "path": path, "points": points}), flush=True)
''')


def engine(tmp_path: Path, mode: str) -> CommandEngine:
    script = tmp_path / "hostile.py"
    script.write_text(SCRIPT, encoding="utf-8")
    return CommandEngine(CommandOptions(command=[sys.executable, str(script)], timeout_s=60, startup_timeout_s=60),
                         env={"MODE": mode}, base_dir=tmp_path)


def request(tmp_path: Path, points=("embed", "layers.0")) -> DumpRequest:
    return DumpRequest(token_ids=(1, 2, 3, 4), points=points, positions=(2, 3), directory=tmp_path / "dumps" / "one")


@pytest.mark.parametrize(("mode", "rule"), [
    ("outside", DumpRule.INSIDE),
    ("symlink", DumpRule.INSIDE),
    ("nan", DumpRule.FINITE),
    ("shape", DumpRule.SHAPE),
    ("float16", DumpRule.DTYPE),
    ("unasked", DumpRule.ASKED),
    ("unknown", DumpRule.KNOWN),
    ("lies", DumpRule.LISTED),
    ("garbage", DumpRule.READABLE),
])
def test_a_hostile_dump_is_an_engine_failure_naming_the_rule(tmp_path, mode, rule):
    eng = engine(tmp_path, mode)
    try:
        with pytest.raises(DumpError) as info:
            capture(eng, request(tmp_path, points=("embed", "layers.0") if mode != "unknown" else None))
        assert info.value.rule == rule
        assert info.value.exit_code == 3 and rule.value in str(info.value)
    finally:
        eng.close()


def test_a_reply_without_a_path_breaks_the_protocol(tmp_path):
    eng = engine(tmp_path, "no_path")
    try:
        with pytest.raises(EngineError, match='"path" must be a non-empty string'):
            capture(eng, request(tmp_path))
    finally:
        eng.close()


def test_the_well_behaved_engine_passes_the_audit(tmp_path):
    """The control: the same script, honest, is accepted (so each refusal above is its rule's)."""
    eng = engine(tmp_path, "good")
    try:
        tensors = capture(eng, request(tmp_path))
        assert sorted(tensors) == ["embed", "layers.0"] and tuple(tensors["embed"].shape) == (2, 4)
    finally:
        eng.close()


def test_an_engine_without_the_dump_capability_is_refused(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text('import json, sys\nprint(json.dumps({"hello": "strict-gate/engine@1"}), flush=True)\n'
                      'for line in sys.stdin:\n    break\n', encoding="utf-8")
    eng = CommandEngine(CommandOptions(command=[sys.executable, str(script)], timeout_s=30, startup_timeout_s=30),
                        base_dir=tmp_path)
    try:
        with pytest.raises(EngineError, match='no "dump"'):
            capture(eng, request(tmp_path))
    finally:
        eng.close()
