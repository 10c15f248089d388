"""The gate and compare end to end on stored runs (the `recorded` engine): no model, no torch."""

import json
import re
from pathlib import Path

from helpers import confident, rec, step, write_gate, write_run
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.report.text import md
from strict_gate.runs.prompts import load_prompts

runner = CliRunner()


def battery(tmp_path: Path):
    p = tmp_path / "set.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": [1, 2, 3]}) + "\n" for i in range(3)))
    return p, load_prompts(p)


def runs(tmp_path, sha, cand_p2=None, drop=None, max_tokens=3):
    ref = [rec("p0", [5, 6, 7]), rec("p1", [8, 9, 10]),
           rec("p2", [11, 12, 13], tops=[confident(11), step((12, -0.6), (40, -0.7)), confident(13)])]
    cand = [rec("p0", [5, 6, 7]), rec("p1", [8, 9, 10]),
            cand_p2 or rec("p2", [11, 40, 13], tops=[confident(11), step((40, -0.65), (12, -0.68)), confident(13)])]
    if drop:
        cand = [c for c in cand if c.id != drop]
    write_run(tmp_path / "ref", ref, sha=sha, max_tokens=max_tokens, model="tiny")
    write_run(tmp_path / "cand", cand, sha=sha, max_tokens=max_tokens, model="tiny")


def gate_toml(tmp_path, prompts, policy="strict", ref_model="tiny"):
    return write_gate(tmp_path, name="offline", prompts=prompts.name, max_tokens=3, policy=policy,
                      output_dir=tmp_path / "reports", reference={"kind": "recorded", "path": "ref", "model": ref_model},
                      candidate={"kind": "recorded", "path": "cand"})


def only_report(tmp_path) -> Path:
    (d,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    return d


def test_gate_near_tie_fails_strict_passes_near_tie(tmp_path):
    prompts, ps = battery(tmp_path)
    runs(tmp_path, ps.sha256)
    r = runner.invoke(app, ["gate", str(gate_toml(tmp_path, prompts))])
    assert r.exit_code == 1, r.output
    d = only_report(tmp_path)
    report = json.loads((d / "report.json").read_text())
    assert report["schema"] == "strict-gate/report@3" and report["verdict"] == "fail"
    assert report["summary"]["prompts_exact"] == 2 and report["summary"]["positions_matched"] == 8
    p2 = report["prompts"][2]
    assert p2["status"] == "near_tie" and p2["first_divergence"]["position"] == 1
    assert abs(p2["first_divergence"]["reference_gap"] - 0.1) < 1e-9
    assert abs(p2["first_divergence"]["candidate_gap"] - 0.03) < 1e-9
    text = (d / "report.md").read_text()
    assert text.startswith("# FAIL: offline — 2/3 prompts exact, 8/9 positions, policy `strict`")
    assert "near-tie fails under strict" in text and report["prompt_set"]["sha256"] in text
    assert (d / "junit.xml").read_text().count("<failure") == 1
    assert "FAIL" in (d / "report.html").read_text()
    assert (d / "reference" / "manifest.json").exists() and (d / "gate.toml").exists()

    r = runner.invoke(app, ["gate", str(gate_toml(tmp_path, prompts)), "--policy", "near-tie",
                            "-o", str(tmp_path / "r2")])
    # stored runs and no [rescorer]: the token after the near-tie cannot be judged, so never a pass
    assert r.exit_code == 3, r.output
    assert "INCOMPLETE" in r.output and "position 2 after the flip not judged" in " ".join(r.output.split())


def test_gate_missing_prompt_is_incomplete(tmp_path):
    prompts, ps = battery(tmp_path)
    runs(tmp_path, ps.sha256, drop="p1")
    r = runner.invoke(app, ["gate", str(gate_toml(tmp_path, prompts, policy="near-tie"))])
    assert r.exit_code == 3, r.output
    report = json.loads((only_report(tmp_path) / "report.json").read_text())
    assert report["verdict"] == "incomplete" and report["prompts"][1]["status"] == "missing"


def test_gate_refuses_a_baseline_of_other_conditions(tmp_path):
    prompts, ps = battery(tmp_path)
    runs(tmp_path, "f" * 64)
    r = runner.invoke(app, ["gate", str(gate_toml(tmp_path, prompts))])
    assert r.exit_code == 2 and "prompt set sha256" in r.output
    runs(tmp_path, ps.sha256, max_tokens=8)
    r = runner.invoke(app, ["gate", str(gate_toml(tmp_path, prompts))])
    assert r.exit_code == 2 and "max_tokens" in r.output
    runs(tmp_path, ps.sha256)
    g = gate_toml(tmp_path, prompts, ref_model="other")
    r = runner.invoke(app, ["gate", str(g)])
    assert r.exit_code == 2 and "model is 'tiny' in the baseline" in r.output


def test_compare_two_stored_runs(tmp_path):
    _, ps = battery(tmp_path)
    runs(tmp_path, ps.sha256)
    r = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand"),
                            "--policy", "near-tie", "--out", str(tmp_path / "out")])
    # no engine re-scores the token after p2's near-tie: unverified, never a pass (issue 24)
    assert r.exit_code == 3, r.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "incomplete" and report["prompts"][2]["outcome"] == "unverified"
    r = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand"), "--band", "0.05"])
    assert r.exit_code == 1


def test_compare_refuses_unfinished_runs_as_complete(tmp_path):
    _, ps = battery(tmp_path)
    write_run(tmp_path / "ref", [rec("p0", [1])], sha=ps.sha256)
    write_run(tmp_path / "cand", [rec("p0", [1])], sha=ps.sha256, finish=False)
    r = runner.invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "cand")])
    assert r.exit_code == 3 and "incomplete" in r.output.lower()


def test_markdown_escaping_keeps_tables_whole():
    nasty = "a|b `code` <script>x</script> *em* [l](u)\nnew # h & c"
    out = md(nasty)
    for bad in ("|b", "`", "<script>", "\n"):
        assert bad not in out.replace("\\|", "")
    assert "\\|" in out and "&lt;script&gt;" in out and "&#96;" in out and "↵" in out


def test_decoder_shows_partial_bytes_and_control_characters_visibly():
    from strict_gate.report.text import Decoder

    dec = Decoder("/nonexistent/tokenizer.json", "bundled:tiny-llama")  # falls back to the 2nd
    assert dec.available
    ids = [t for t in range(1024) if dec.token(t).startswith("<0x")]
    assert ids, "a byte-level vocabulary has pieces of multi-byte characters"
    # A byte outside a character is <0xNN>; \xNN stays for control characters only (below 0x80).
    assert all("\ufffd" not in dec.token(t) and "\n" not in dec.token(t)
               and not re.search(r"\\x[89a-f]", dec.token(t)) for t in range(1024))
    nl = dec._tok.encode("a\nb").ids
    assert "\\n" in [dec.token(t) for t in nl]
    assert Decoder(None).token(5) == "<5>"
