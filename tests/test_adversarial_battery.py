"""Hostile inputs to `strict-gate battery`: every one is exit 2 naming the file, or shown escaped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import rec, step, write_run
from typer.testing import CliRunner

from strict_gate.battery.build import score
from strict_gate.battery.view import battery_html, print_battery
from strict_gate.cli import app
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.reader import load_run

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
REF = str(REPO / "examples/battery/hf-fp32.toml")


def build(tmp_path, *pool, extra=()):
    return runner.invoke(app, ["battery", "build", *map(str, pool), "--reference", REF, "--size", "1",
                               *extra, "--out", str(tmp_path / "b.jsonl")])


def test_a_fifo_as_pool_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "pool.txt"
    os.mkfifo(fifo)
    r = build(tmp_path, fifo, extra=["--split"])
    assert r.exit_code == 2 and "not a regular file" in r.output


def test_a_pool_text_that_is_not_utf8_is_refused(tmp_path):
    bad = tmp_path / "latin.txt"
    bad.write_bytes(b"caf\xe9 " * 100)
    r = build(tmp_path, bad, extra=["--split"])
    assert r.exit_code == 2 and f"{bad}: not UTF-8" in r.output


def test_a_text_too_short_for_one_passage_is_an_empty_pool(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("two words", encoding="utf-8")
    r = build(tmp_path, short, extra=["--split"])
    assert r.exit_code == 2 and "holds no prompts" in r.output


def test_a_directory_that_is_not_a_run_beside_the_output_is_not_written_into(tmp_path):
    (tmp_path / "b.run").mkdir()
    (tmp_path / "b.run" / "precious.txt").write_text("keep", encoding="utf-8")
    r = build(tmp_path, REPO / "prompts/smoke.jsonl")
    assert r.exit_code == 2 and "not a run directory" in r.output
    assert (tmp_path / "b.run" / "precious.txt").read_text() == "keep"


def test_an_out_that_is_not_jsonl_is_refused(tmp_path):
    r = runner.invoke(app, ["battery", "build", str(REPO / "prompts/smoke.jsonl"), "--reference", REF,
                            "--size", "1", "--out", str(tmp_path / "b.txt")])
    assert r.exit_code == 2 and ".jsonl" in r.output


@pytest.mark.parametrize("doc", ["{not json", '{"schema": "strict-gate/run@1"}', "[]",
                                 '{"schema": "strict-gate/battery@1", "prompt_set": 3}'])
def test_a_broken_provenance_is_exit_2_naming_it(tmp_path, doc):
    ps = tmp_path / "b.jsonl"
    ps.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    (tmp_path / "b.provenance.json").write_text(doc, encoding="utf-8")
    r = runner.invoke(app, ["battery", "show", str(ps)])
    assert r.exit_code == 2 and "b.provenance.json" in r.output and "Traceback" not in r.output


def test_show_without_a_provenance_points_at_score(tmp_path):
    r = runner.invoke(app, ["battery", "show", str(REPO / "prompts/smoke.jsonl")])
    assert r.exit_code == 2 and "battery score" in r.output


def test_hostile_ids_are_escaped_in_the_terminal_and_the_page(tmp_path):
    ids = ["\x1b[2J\x1b]0;pwned\x07", "<script>alert(1)</script>"]
    ps = tmp_path / "p.jsonl"
    ps.write_text("".join(json.dumps({"id": i, "text": "x", "tags": [i]}) + "\n" for i in ids), encoding="utf-8")
    prompts = load_prompts(ps)
    tops = [step((5, -0.1), (6, -0.2))]
    run = write_run(tmp_path / "run", [rec(i, [5], prompt=(1, k), tops=tops) for k, i in enumerate(ids)],
                    sha=prompts.sha256)  # distinct token ids: a copy would be counted once, and not shown
    doc = score(prompts, load_run(run), 0.5)
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    print_battery(doc, Console(file=buf, width=200, markup=False, highlight=False))
    assert "\x1b" not in buf.getvalue() and "\\x1b" in buf.getvalue()
    page = battery_html(doc)
    assert "<script>" not in page and "&lt;script&gt;" in page


@pytest.mark.parametrize("opts", [["--scale", "nan"], ["--scale", "-1"], ["--max-share", "0"],
                                  ["--min-per-group", "-1"]])
def test_nonsense_rule_parameters_are_exit_2_before_the_reference_runs(tmp_path, opts):
    ps = tmp_path / "p.jsonl"
    ps.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n', encoding="utf-8")
    r = runner.invoke(app, ["battery", "build", str(ps), "--reference", REF, "--size", "1", *opts,
                            "--out", str(tmp_path / "b.jsonl")])
    assert r.exit_code == 2, r.output
    assert not (tmp_path / "b.jsonl").exists() and not (tmp_path / "b.run").exists()


# ---------------------------------------------------------------------------- issue 26, item 15: copies


def test_one_prompt_four_times_is_scored_as_one(tmp_path, monkeypatch):
    """A set of one prompt under four ids (the reference gives the same record for each): was
    detection 1 - (1 - p)^4 over four "independent" prompts (93 % where one copy gives 49 %).
    The stored run is written by hand: its records are what any greedy reference gives a copy."""
    monkeypatch.chdir(tmp_path)
    tops = [step((5, -0.60), (6, -0.61)), step((7, -0.1), (8, -0.2))]
    for name, ids in (("one", ["a"]), ("four", ["a", "b", "c", "d"])):
        Path(f"{name}.jsonl").write_text("".join(json.dumps({"id": i, "text": "the same words"}) + "\n" for i in ids),
                                         encoding="utf-8")
        write_run(Path(f"{name}.run"), [rec(i, [5, 7], prompt=(1, 9, 9), tops=tops) for i in ids],
                  sha=load_prompts(Path(f"{name}.jsonl")).sha256)
    docs = {name: score(load_prompts(Path(f"{name}.jsonl")), load_run(Path(f"{name}.run")), 0.5)
            for name in ("one", "four")}
    assert docs["four"]["sensitivity"]["detection"] == docs["one"]["sensitivity"]["detection"]
    shown = runner.invoke(app, ["battery", "score", "four.jsonl", "--run", "four.run"], terminal_width=200)
    assert shown.exit_code == 0 and "3 prompts the reference errored on or copies of another" in shown.output
    assert [e["id"] for e in docs["four"]["excluded"]] == ["b", "c", "d"]
    assert "a copy of prompt 'a' (the same token ids)" in docs["four"]["excluded"][0]["error"]


def test_a_pool_with_copies_never_puts_two_in_a_battery(tmp_path, monkeypatch):
    """A .jsonl pool holding one text under three ids beside one other, the bundled model
    through hf (real). Was: --size 3 built a battery holding copies (exit 0)."""
    monkeypatch.chdir(tmp_path)
    texts = {"x1": "The cat sat on the", "x2": "The cat sat on the", "x3": "The cat sat on the", "y": "One, two,"}
    Path("pool.jsonl").write_text("".join(json.dumps({"id": i, "text": t, "tags": ["g"]}) + "\n"
                                          for i, t in texts.items()), encoding="utf-8")
    argv = ["battery", "build", "pool.jsonl", "--reference", REF, "--max-tokens", "4", "--max-share", "1",
            "--out", "b.jsonl"]
    r = runner.invoke(app, [*argv, "--size", "3"], terminal_width=200)
    assert r.exit_code == 2 and "2 distinct prompts the reference answered" in r.output, r.output
    r = runner.invoke(app, [*argv, "--size", "2"], terminal_width=200)  # the reference run above is reused
    assert r.exit_code == 0, r.output
    chosen = sorted(json.loads(line)["text"] for line in Path("b.jsonl").read_text().splitlines())
    assert chosen == sorted(set(texts.values()))
    prov = json.loads(Path("b.provenance.json").read_text())
    assert [e["id"] for e in prov["pool"]["excluded"]] == ["x2", "x3"]
