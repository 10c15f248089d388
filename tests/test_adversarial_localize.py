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
        elif mode == "zeros":
            good["layers.0"] = torch.zeros(n, 4)
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
        elif mode.startswith("expert:"):  # expert:NAME,NAME: routed experts' points (all ones)
            good |= {name: torch.ones(n, 4) for name in mode.split(":", 1)[1].split(",")}
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
    ("zeros", DumpRule.NONZERO),  # the CI tier's test of the rule item6's [zeros] gate keeps in the slow tier
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


FAMILY = ("embed", "layers.0", "layers.0.mlp.experts.down_proj")  # every routed expert of layer 0, by family


@pytest.mark.parametrize(("given", "asked", "rule"), [
    ("layers.0.mlp.experts.3.down_proj", ("embed", "layers.0", "layers.0.mlp.router"), DumpRule.ASKED),
    ("layers.1.mlp.experts.0.down_proj", FAMILY, DumpRule.ASKED),  # another layer's experts
    ("layers.0.mlp.experts.down_proj", FAMILY, DumpRule.KNOWN),  # the family's name asks; it names no tensor
    ("layers.0.mlp.experts.01.down_proj", FAMILY, DumpRule.KNOWN),
])
def test_expert_points_are_given_only_as_asked(tmp_path, given, asked, rule):
    """Each routed expert's down projection is asked for by its layer's family name; an engine
    that gives another layer's, an unasked one, or a tensor under the family's own name is refused."""
    eng = engine(tmp_path, f"expert:{given}")
    try:
        with pytest.raises(DumpError) as info:
            capture(eng, request(tmp_path, points=asked))
        assert info.value.rule == rule and given in str(info.value)
    finally:
        eng.close()


def test_experts_asked_by_family_pass_the_audit(tmp_path):
    """The control: the experts a kept position chose (0 and 2 here), asked for by family."""
    eng = engine(tmp_path, "expert:layers.0.mlp.experts.0.down_proj,layers.0.mlp.experts.2.down_proj")
    try:
        tensors = capture(eng, request(tmp_path, points=FAMILY)).tensors
        assert sorted(tensors) == ["embed", "layers.0", "layers.0.mlp.experts.0.down_proj",
                                   "layers.0.mlp.experts.2.down_proj"]
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
        tensors = capture(eng, request(tmp_path)).tensors
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


# --- Issue 26, items 1-7: the way a user runs it (a working directory, relative paths, the CLI),
# against a toy model engine (tests/engines/toy_dump_engine.py) that is honest or hostile on purpose.

TOY = Path(__file__).parent / "engines" / "toy_dump_engine.py"
PROMPTS = [{"id": f"p{i}", "token_ids": [(5 * i + j * 7 + 1) % 32 for j in range(6)]} for i in range(6)]


def toy_gate(where: Path, *, bug: str = "mlp1", mode: str = "", ref_env: dict | None = None,
             cand_env: dict | None = None, dump_mode: str | None = None) -> str:
    """gate.toml in `where` with relative paths: output_dir "reports", localize "all" (a
    [localize] table with `mode = dump_mode` when given)."""
    import json

    (where / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    arm = f'kind = "command"\ncommand = ["python", "{TOY}"]\n'
    env = {"BUG": bug, "MODE": mode} | (cand_env or {})
    text = ('name = "toy"\nprompts = "p.jsonl"\nmax_tokens = 8\ntop_logprobs = 5\npolicy = "strict"\n'
            'output_dir = "reports"\n' + ('localize = "all"\n' if dump_mode is None else "")
            + f"[reference]\n{arm}[reference.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in (ref_env or {}).items())
            + f"[candidate]\n{arm}[candidate.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
            + ("" if dump_mode is None else f'[localize]\ninclude = "all"\nmode = "{dump_mode}"\n'))
    (where / "gate.toml").write_text(text, encoding="utf-8")
    return "gate.toml"


def cli(*args: str):
    import os
    import subprocess

    return subprocess.run([sys.executable, "-m", "strict_gate.cli", *args], capture_output=True, text=True,
                          env=os.environ | {"COLUMNS": "200"}, timeout=600)


def gated(tmp_path: Path, monkeypatch, **kw) -> tuple[Path, dict]:
    """Run the gate from tmp_path as a user does; the report directory (relative) and report.json."""
    import json

    monkeypatch.chdir(tmp_path)
    out = cli("gate", toy_gate(Path("."), **kw))
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    assert out.returncode in (0, 1, 3), out.stdout + out.stderr
    report_dir = Path(next(p for p in Path("reports").iterdir() if p.is_dir()))
    assert not report_dir.is_absolute()
    return report_dir, json.loads((report_dir / "report.json").read_text(encoding="utf-8"))


def localised(report: dict) -> dict[str, dict]:
    return {p["id"]: p["localization"] for p in report["prompts"] if p.get("localization")}


def test_item1_relative_report_dir_localises_in_the_gate_and_with_localize(tmp_path, monkeypatch):
    """output_dir = "reports" and `strict-gate localize reports/X` from the working directory:
    every divergence is localised to the planted layer (before: every prompt "not localised",
    the engine blamed for a path the localiser joined twice)."""
    report_dir, report = gated(tmp_path, monkeypatch)
    locs = localised(report)
    assert locs and all(loc["error"] is None and loc["first_beyond"] == "layers.1.mlp" for loc in locs.values()), locs
    out = cli("localize", str(report_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "first beyond tolerance: layers.1.mlp" in out.stdout and "not localised" not in out.stdout
    assert "[bold]" not in out.stdout  # each prompt's heading is styled, not printed as raw markup


def test_item2_points_left_out_never_let_a_summary_blame_a_later_point(tmp_path, monkeypatch):
    """The candidate leaves out layers.1.mlp and layers.1, the bug is in layer 1's MLP: no summary
    may say "within tolerance up to norm" or name norm alone."""
    report_dir, report = gated(tmp_path, monkeypatch, mode="missing")
    for loc in localised(report).values():
        assert loc["error"] is None
        assert loc["not_compared"] == ["layers.1.mlp", "layers.1"], loc
        assert "within tolerance up to" not in loc["pattern"] and "layers.1.mlp" in loc["pattern"]
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    assert "or earlier, not compared: layers.1.mlp, layers.1" in md
    shown = cli("show", str(report_dir), "--prompt", next(iter(localised(report))))
    assert "or earlier, not compared: layers.1.mlp, layers.1" in shown.stdout, shown.stdout + shown.stderr


@pytest.mark.parametrize("case", [{"bug": "kv1"}, {"bug": "mlp1", "mode": "copy"}])
def test_item3_a_dump_that_did_not_reproduce_never_reads_every_point_equal(tmp_path, monkeypatch, case):
    """A decode-only cache bug (prefill, score and dump honest), and a candidate that copies the
    reference's dump: its dump picks the reference's token, and every format says so."""
    report_dir, report = gated(tmp_path, monkeypatch, **case)
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["reproduced"] == {"reference": True, "candidate": False}, loc
        assert "equal" not in loc["pattern"] and "another path" in loc["pattern"]
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert "candidate NO (prefill)" in md and "another path" in md
    assert "NOT REPRODUCED by the candidate&#x27;s prefill dump" in html


def test_item4_the_file_the_reply_named_is_compared_not_a_decoy(tmp_path, monkeypatch):
    """The reply names sub/activations.safetensors; a decoy (every value halved) lies beside it."""
    _, report = gated(tmp_path, monkeypatch, mode="decoy")
    locs = localised(report)
    assert locs and all(loc["first_beyond"] == "layers.1.mlp" for loc in locs.values()), locs


def test_item4_a_file_rewritten_after_the_audit_is_refused(tmp_path, monkeypatch):
    _, report = gated(tmp_path, monkeypatch, mode="rewrite")
    locs = localised(report)
    assert locs and all("changed after the audit" in (loc["error"] or "") for loc in locs.values()), locs


def test_item4_nan_is_never_a_rel_diff_of_zero():
    import math

    import torch

    from strict_gate.localize.compare import point_diff

    d = point_diff("layers.0", torch.ones(2, 4), torch.full((2, 4), float("nan")), 1e-10)
    assert d.beyond and math.isnan(d.rel_diff) and "not finite" in d.note


def test_item5_a_file_in_a_subdirectory_is_read_without_a_traceback(tmp_path, monkeypatch):
    _, report = gated(tmp_path, monkeypatch, mode="subdir")
    locs = localised(report)
    assert locs and all(loc["first_beyond"] == "layers.1.mlp" for loc in locs.values()), locs


@pytest.mark.parametrize(("mode", "words"), [
    ("positions", "the dump is of other positions"),
    ("ids", "the dump is of other"),  # other ids: those of other positions where an id recurs
    ("zeros", "is all zeros"),
    ("extra_layer", "layers.7, of layers the model lacks"),
    ("wide", "shapes differ at layers.0"),
])
def test_item6_a_dump_of_something_else_is_refused_as_such(tmp_path, monkeypatch, mode, words):
    """Never blamed on embed, never "absent on the reference", never skipped."""
    _, report = gated(tmp_path, monkeypatch, mode=mode)
    locs = localised(report)
    assert locs and all(words in (loc["error"] or "") and loc["first_beyond"] is None for loc in locs.values()), locs


def test_item6_embed_rows_of_other_ids_are_refused_as_such():
    """The CI tier's test of the rule item6's [ids] gate keeps in the slow tier: embed rows that
    match no row of the reference's are a dump of other ids, never a difference blamed on embed."""
    import torch

    from strict_gate.localize.compare import refusal

    ref = {"embed": torch.eye(3, 4), "layers.0": torch.ones(3, 4)}
    cand = {"embed": torch.ones(3, 4), "layers.0": torch.ones(3, 4)}
    assert "the dump is of other ids" in (refusal(ref, cand) or "")
    assert refusal(ref, {**cand, "embed": torch.eye(3, 4)}) is None


def test_item7_localize_one_prompt_raises_only_its_own_errors(tmp_path, monkeypatch):
    """p1's dump fails in the gate; `localize --prompt p0` localises p0 and exits 0."""
    report_dir, report = gated(tmp_path, monkeypatch, cand_env={"FAIL_FIRST_ID": "6"})
    assert localised(report)["p1"]["error"] and localised(report)["p0"]["error"] is None
    out = cli("localize", str(report_dir), "--prompt", "p0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert cli("localize", str(report_dir), "--prompt", "p1").returncode == 3


def test_item7_a_candidate_that_cannot_dump_is_exit_2_before_the_reference_starts(tmp_path, monkeypatch):
    marker = tmp_path / "reference-started"
    report_dir, report = gated(tmp_path, monkeypatch, mode="no_dump", ref_env={"STARTED": str(marker)})
    assert not localised(report) and any("cannot dump" in n for n in report["notes"]), report["notes"]
    marker.unlink()
    out = cli("localize", str(report_dir))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cannot dump activations" in out.stdout + out.stderr
    assert not marker.exists(), "the reference was started before the candidate's capability was checked"


# --- Issue 27: the decode path. A decode-only cache bug, an engine that dumps along its decode
# path, and one that declares the decode mode and answers with its prefill pass (a lie).

def test_a_decode_only_bug_is_localised_along_the_decode_path(tmp_path, monkeypatch):
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode="decode")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["reproduced"] == {"reference": True, "candidate": True}, loc
        assert [r["path"] for r in loc["reproduction"]] == ["prefill", "decode"]
        assert loc["first_beyond"] == "layers.1.attn", loc["points"]
    assert "candidate yes (decode)" in (report_dir / "report.md").read_text(encoding="utf-8")


def test_a_decode_dump_that_lies_is_said_not_to_reproduce(tmp_path, monkeypatch):
    """It declares "dump_decode" and answers with its prefill pass: its dump still picks the
    reference's token, and the report says the decode dump did not reproduce."""
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode="decode_lies")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["reproduced"]["candidate"] is False and loc["reproduction"][1]["path"] == "decode", loc
        assert "equal" not in loc["pattern"] and "decode dump picks" in loc["pattern"]
    assert "candidate NO (decode)" in (report_dir / "report.md").read_text(encoding="utf-8")
