"""Issue 27, localisation along the decode path and grafting at ops, the way a user runs it:
`strict-gate gate` from a working directory with relative paths (output_dir "reports"), then
`strict-gate localize reports/X`, against the toy engine (tests/engines/toy_dump_engine.py:
a real process over the command protocol, a small float32 model, honest or hostile on purpose).

The hostile engines lie in decode-mode dumps (a prefill dump for a decode one, decode_from
ignored, other positions, the reference's dump copied) or about grafting at ops (declared and
ignored). Each is refused or reported by name, never "every point equal", never a pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_adversarial_localize import cli, gated, localised, toy_gate

pytest.importorskip("safetensors")
pytest.importorskip("torch")

DECODING = {"MODE": "decode"}  # the reference dumps along its decode path too


def never_a_pass(report: dict) -> None:
    assert report["verdict"] != "pass", report["verdict"]


def test_mode_decode_localises_a_decode_only_bug_on_both_arms_decode_paths(tmp_path, monkeypatch):
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode="decode", ref_env=DECODING,
                               dump_mode="decode")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["dump_mode"] == "decode" and loc["error"] is None, loc
        assert [(r["path"], r["reproduced"]) for r in loc["reproduction"]] == [("decode", True), ("decode", True)]
        assert loc["first_beyond"] == "layers.1.attn", loc["points"]
    never_a_pass(report)


def test_mode_both_reports_both_dumps_side_by_side_in_every_format(tmp_path, monkeypatch):
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode="decode", ref_env=DECODING,
                               dump_mode="both")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["dump_mode"] == "both" and loc["decode"] is not None
        assert loc["reproduced"] == {"reference": True, "candidate": False}, loc  # prefill: another path
        assert "equal" not in loc["pattern"] and "another path" in loc["pattern"]
        assert loc["decode"]["reproduced"] == {"reference": True, "candidate": True}, loc["decode"]
        assert loc["decode"]["first_beyond"] == "layers.1.attn"
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    pid = next(iter(locs))
    assert f"| `{pid}` | prefill |" in md and f"| `{pid}` | decode |" in md
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert "Localisation: prefill path" in html and "Localisation: decode path" in html
    out = cli("localize", str(report_dir), "--prompt", pid, "--mode", "both")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prefill path: first beyond" in out.stdout and "decode path: first beyond tolerance: layers.1.attn" in \
        out.stdout
    shown = cli("show", str(report_dir), "--prompt", pid)
    assert "decode path: first beyond tolerance: layers.1.attn" in shown.stdout, shown.stdout + shown.stderr


@pytest.mark.parametrize(("mode", "words"), [
    ("decode_from_ignored", "decode_from ignored"),
    ("decode_positions", "other positions"),
])
def test_a_decode_dump_of_another_path_is_refused_by_name(tmp_path, monkeypatch, mode, words):
    """It declares "dump_decode" and decodes from the first id, or answers with the rows of other
    positions: its rows before decode_from are not its own prefill's."""
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode=mode, ref_env=DECODING, dump_mode="decode")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert words in (loc["error"] or "") and "candidate's" in loc["error"], loc
        assert loc["first_beyond"] is None and not loc["points"]
    assert any("decode dump differs from its own prefill dump" in n for n in report["notes"]), report["notes"]
    never_a_pass(report)
    assert cli("localize", str(report_dir), "--mode", "decode").returncode == 3


@pytest.mark.parametrize("mode", ["decode_lies", "decode_copy"])
def test_a_decode_dump_that_does_not_choose_its_token_is_said_not_to_reproduce(tmp_path, monkeypatch, mode):
    """Its prefill pass for a decode dump, or the reference's decode dump copied: the dump picks
    the reference's token where the candidate generated another, and every format says so."""
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode=mode, ref_env=DECODING, dump_mode="decode")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        cand = loc["reproduction"][1]
        assert (cand["arm"], cand["path"], cand["reproduced"]) == ("candidate", "decode", False), loc
        assert "equal" not in loc["pattern"] and "decode dump picks" in loc["pattern"], loc["pattern"]
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    assert "candidate NO (decode)" in md and "every point compared equal" not in md
    never_a_pass(report)


def test_mode_decode_with_a_reference_that_cannot_decode_is_said_by_name(tmp_path, monkeypatch):
    report_dir, report = gated(tmp_path, monkeypatch, bug="kv1", mode="decode", dump_mode="decode")
    locs = localised(report)
    assert locs and all("reference (command) cannot dump along its decode path" in (loc["error"] or "")
                        for loc in locs.values()), locs


@pytest.mark.parametrize(("bug", "op", "follows"), [
    ("mlp1", "layers.1.mlp.up_proj", ["layers.1.mlp.act", "layers.1.mlp.down_proj"]),
    ("down1", "layers.1.mlp.down_proj", []),
])
def test_grafting_at_ops_says_wrong_alone_or_follows(tmp_path, monkeypatch, bug, op, follows):
    report_dir, report = gated(tmp_path, monkeypatch, bug=bug, mode="graft_ops")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["first_beyond_op"] == op and loc["first_beyond_op_alone"] == "wrong alone", loc
        assert loc["alone"] == {op: "wrong alone"} | {f: "follows when fed the reference's input: drift from "
                                                      "earlier" for f in follows}, loc["alone"]
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    assert f"{op} (grafted: wrong alone)" in md
    out = cli("localize", str(report_dir))
    assert out.returncode == 0 and f"first op beyond: {op} (grafted: wrong alone)" in out.stdout, out.stdout


def test_grafting_at_ops_along_the_decode_path(tmp_path, monkeypatch):
    """The decode-only cache bug, grafted at ops along the decode path: the attention (its prefix
    mean over the cache) is wrong alone, fed the reference's queries."""
    _, report = gated(tmp_path, monkeypatch, bug="kv1", mode="decode,graft_ops")
    for loc in localised(report).values():
        assert loc["reproduction"][1]["path"] == "decode" and loc["first_beyond"] == "layers.1.attn", loc
        assert loc["first_beyond_op"] == "layers.1.attn.core", loc["ops"]
        assert loc["first_beyond_op_alone"] == "wrong alone", (loc["alone"], loc["op_graft_note"])


def test_an_engine_that_claims_graft_ops_and_ignores_the_graft_is_refused(tmp_path, monkeypatch):
    """Its ops come back bit for bit its own where their inputs differ from the reference's beyond
    tolerance: act and down_proj would read "wrong alone" (a false blame); refused by name."""
    report_dir, report = gated(tmp_path, monkeypatch, bug="mlp1", mode="graft_ignored")
    locs = localised(report)
    assert locs
    for loc in locs.values():
        assert loc["op_graft_refused"] and "ignored the graft" in loc["op_graft_note"], loc
        assert loc["alone"] == {} and loc["first_beyond_op_alone"] is None
        assert loc["first_beyond_op"] == "layers.1.mlp.up_proj"  # the narrowing itself stands
    assert any("ignored the graft" in n for n in report["notes"]), report["notes"]
    assert "ignored the graft" in (report_dir / "report.md").read_text(encoding="utf-8")
    never_a_pass(report)
    out = cli("localize", str(report_dir))
    assert out.returncode == 3 and "ignored the graft" in out.stdout + out.stderr


def test_a_bad_mode_is_exit_2_naming_the_option_or_the_file_and_line(tmp_path, monkeypatch):
    report_dir, _ = gated(tmp_path, monkeypatch)
    out = cli("localize", str(report_dir), "--mode", "sideways")
    assert out.returncode == 2 and "--mode" in out.stdout + out.stderr and "Traceback" not in out.stderr
    toy_gate(Path("."), dump_mode="sideways")
    out = cli("gate", "gate.toml")
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "gate.toml" in text and "Traceback" not in text, text
    line = next(i for i, s in enumerate(Path("gate.toml").read_text().splitlines(), 1) if s.startswith("mode"))
    assert f":{line}" in text or f"line {line}" in text, text
