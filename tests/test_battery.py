"""strict-gate battery: the flip model, selection, the pool, and build/show/score on a real
engine (hf, the bundled model) over a small pool. Hostile inputs: test_adversarial_battery.py."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest
from helpers import rec, step, write_run
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from strict_gate.battery.margins import battery_detection, calibrate, profile, prompt_flip_probabilities
from strict_gate.battery.pool import Split, cut_passages, load_pool
from strict_gate.battery.select import Candidate, Coverage, select
from strict_gate.cli import app
from strict_gate.errors import InputError
from strict_gate.runs.prompts import load_prompts

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent


def margin_rec(pid: str, *gaps: float):
    """A record whose step i has top-2 margin gaps[i]."""
    return rec(pid, range(5, 5 + len(gaps)), tops=[step((5 + i, -0.1), (900 + i, -0.1 - g)) for i, g in enumerate(gaps)])


# -- the flip model ---------------------------------------------------------------


def test_a_tie_flips_half_the_time_and_a_wide_margin_never():
    p = prompt_flip_probabilities([profile(margin_rec("t", 0.0)), profile(margin_rec("w", 5.0))], 0.01)
    assert p[0] == pytest.approx(0.5)
    assert p[1] == 0.0


@given(st.lists(st.floats(0, 3), min_size=1, max_size=8), st.floats(1e-4, 1.0), st.floats(1.01, 10))
def test_flip_probability_grows_with_sigma_and_stays_a_probability(gaps, sigma, factor):
    prof = profile(margin_rec("a", *gaps))
    lo, hi = prof.flip_probability(sigma), prof.flip_probability(sigma * factor)
    assert 0.0 <= lo <= hi <= 1.0


def test_steps_combine_as_independent_chances():
    one = profile(margin_rec("a", 0.01)).flip_probability(0.01)
    two = profile(margin_rec("b", 0.01, 0.01)).flip_probability(0.01)
    assert two == pytest.approx(1 - (1 - one) ** 2)
    assert battery_detection(prompt_flip_probabilities([profile(margin_rec("c", 0.01))] * 2, 0.01)) == pytest.approx(two)


def test_calibration_finds_the_scale_of_one_flip_in_a_hundred():
    profs = [profile(margin_rec(f"p{i}", 0.01 * (i + 1), 0.3)) for i in range(50)]
    sigma = calibrate(profs, 0.01)
    assert prompt_flip_probabilities(profs, sigma).mean() == pytest.approx(0.01, rel=1e-2)


def test_a_record_without_a_runner_up_is_refused():
    with pytest.raises(InputError, match="fewer than 2 top logprobs"):
        profile(rec("a", [5], tops=[step((5, -0.1))]))


# -- selection --------------------------------------------------------------------


def cands(spec):
    return [Candidate(f"{g}{i}", g, p, m) for i, (g, p, m) in enumerate(spec)]


POOL = cands([("a", 0.9, 0.01), ("a", 0.8, 0.02), ("a", 0.7, 0.03), ("a", 0.6, 0.04),
              ("b", 0.1, 0.2), ("b", 0.05, 0.3), ("c", 0.0, 1.0), ("c", 0.0, 1.0), ("c", 0.0, 1.0)])


def test_the_same_seed_gives_the_same_battery_and_ties_follow_the_seed():
    cov = Coverage(0, 1.0)
    ties = cands([("t", 0.0, 1.0)] * 20)
    assert [c.id for c in select(ties, 5, cov, seed=3)] == [c.id for c in select(ties, 5, cov, seed=3)]
    assert {tuple(c.id for c in select(ties, 5, cov, seed=s)) for s in range(6)} != {
        tuple(c.id for c in select(ties, 5, cov, seed=0))}


def test_without_constraints_the_most_likely_to_flip_win():
    assert [c.id for c in select(POOL, 3, Coverage(0, 1.0))] == ["a0", "a1", "a2"]


def test_coverage_keeps_every_group_and_caps_the_best_one():
    chosen = select(POOL, 4, Coverage(1, 0.5))
    groups = [c.group for c in chosen]
    assert set(groups) == {"a", "b", "c"} and groups.count("a") == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 1), st.floats(0, 2)), min_size=1, max_size=9),
       st.integers(1, 9), st.integers(0, 2), st.sampled_from([0.34, 0.5, 1.0]))
def test_selection_is_feasible_and_optimal(spec, n, floor, share):
    pool, cov = cands(spec), Coverage(floor, share)
    try:
        chosen = select(pool, n, cov)
    except InputError:
        return
    got = [c.group for c in chosen]
    assert len(chosen) == n and len({c.id for c in chosen}) == n
    sizes = {g: sum(1 for c in pool if c.group == g) for g in "abc"}
    assert all(got.count(g) >= min(floor, sizes[g]) and got.count(g) <= cov.cap(n) for g in sizes)
    best = max(sum(c.p_flip for c in combo) for combo in combinations(pool, n)
               if all(min(floor, sizes[g]) <= [x.group for x in combo].count(g) <= cov.cap(n) for g in sizes))
    assert sum(c.p_flip for c in chosen) == pytest.approx(best)


def test_a_pool_smaller_than_n_is_refused():
    with pytest.raises(InputError, match="holds 9 prompts, fewer than --size 10"):
        select(POOL, 10, Coverage(0, 1.0))


def test_a_ceiling_too_low_for_n_is_refused():
    with pytest.raises(InputError, match="raise --max-share"):
        select(POOL, 8, Coverage(0, 0.2))


# -- the pool ---------------------------------------------------------------------

TEXT = " ".join(f"word{i}" for i in range(500)) + "\n" + "repeat this passage " * 40


def test_passages_are_cut_to_the_range_deterministically_and_deduplicated():
    split = Split(5, 9, seed=4)
    a = cut_passages(TEXT, "src", split, set())
    assert a == cut_passages(TEXT, "src", split, set())
    assert all(5 <= len(p.text.split()) <= 9 for p in a)
    norm = [" ".join(p.text.split()).casefold() for p in a]
    assert len(norm) == len(set(norm)) < len(TEXT.split()) // 5
    assert cut_passages(TEXT, "src", Split(5, 9, seed=5), set()) != a


def test_text_needs_split_and_ids_are_unique_over_the_pool(tmp_path):
    t = tmp_path / "notes.txt"
    t.write_text(TEXT, encoding="utf-8")
    with pytest.raises(InputError, match="pass --split"):
        load_pool([t])
    pool = load_pool([t], Split(5, 9))
    assert set(pool.groups.values()) == {"notes"} and pool.sources[0].kind == "text"
    with pytest.raises(InputError, match="ids must be unique"):
        load_pool([REPO / "prompts" / "smoke.jsonl", REPO / "prompts" / "smoke.jsonl"])


def test_the_shipped_pool_is_large_hashed_and_spread():
    ps = load_prompts(REPO / "prompts" / "pool-2k.jsonl")
    assert len(ps) >= 2000
    assert len({p.tags[0] for p in ps.prompts}) >= 6
    src = json.loads((REPO / "prompts" / "pool-2k.sources.json").read_text())
    assert src["inputs"] and all(len(h) == 64 for h in src["inputs"].values())


# -- bad input on the command line: exit 2 with file and line -------------------------


def test_a_bad_pool_line_is_exit_2_with_file_and_line(tmp_path):
    bad = tmp_path / "pool.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": \n', encoding="utf-8")
    r = runner.invoke(app, ["battery", "build", str(bad), "--reference", str(REPO / "examples/battery/hf-fp32.toml"),
                            "--size", "1", "--out", str(tmp_path / "b.jsonl")])
    assert r.exit_code == 2 and f"{bad}:2:" in r.output and "Traceback" not in r.output


def test_a_bad_reference_config_is_exit_2_with_file_and_line(tmp_path):
    cfg = tmp_path / "ref.toml"
    cfg.write_text('kind = "hf"\nmodel = "bundled:tiny-llama"\ndtyp = "float32"\n', encoding="utf-8")
    r = runner.invoke(app, ["battery", "build", str(REPO / "prompts/smoke.jsonl"), "--reference", str(cfg),
                            "--size", "1", "--out", str(tmp_path / "b.jsonl")])
    assert r.exit_code == 2 and f"{cfg}:3:" in r.output


@pytest.mark.parametrize("args", [["--split", "--split-words", "9"], ["--split", "--split-words", "9:3"],
                                  ["--band", "nan"], ["--size", "9"]])
def test_bad_options_are_exit_2(tmp_path, args):
    r = runner.invoke(app, ["battery", "build", str(REPO / "prompts/smoke.jsonl"), "--reference",
                            str(REPO / "examples/battery/hf-fp32.toml"), "--size", "2", *args,
                            "--out", str(tmp_path / "b.jsonl")])
    assert r.exit_code == 2, r.output
    assert not (tmp_path / "b.run").exists()  # refused before any engine ran


def test_score_of_a_stored_baseline_needs_no_engine(tmp_path):
    ps = load_prompts(REPO / "prompts" / "battery-128.jsonl")
    r = runner.invoke(app, ["battery", "score", str(ps.path), "--run", str(REPO / "baselines/tiny-llama-vllm-fp32"),
                            "--html", str(tmp_path / "s.html")])
    assert r.exit_code == 0, r.output
    assert "expected detection" in r.output and "<table>" in (tmp_path / "s.html").read_text()
    other = runner.invoke(app, ["battery", "score", str(REPO / "prompts/smoke.jsonl"), "--run",
                                str(REPO / "baselines/tiny-llama-vllm-fp32")])
    assert other.exit_code == 2 and "not " in other.output


def test_score_refuses_a_run_without_runner_ups(tmp_path):
    ps = tmp_path / "p.jsonl"
    ps.write_text('{"id": "a", "text": "x"}\n', encoding="utf-8")
    sha = load_prompts(ps).sha256
    run = write_run(tmp_path / "run", [rec("a", [5], tops=[step((5, -0.1))])], sha=sha, top=1)
    r = runner.invoke(app, ["battery", "score", str(ps), "--run", str(run)])
    assert r.exit_code == 2 and "top-logprobs" in r.output


# -- real engine: hf, the bundled model, a small pool ----------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("battery")
    pool = d / "pool.jsonl"
    rows = [json.loads(x) for x in (REPO / "prompts/battery-128.jsonl").read_text().splitlines()][::8]
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = d / "b.jsonl"
    args = ["battery", "build", str(pool), "--reference", str(REPO / "examples/battery/hf-fp32.toml"),
            "--size", "6", "--max-tokens", "4", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return {"dir": d, "pool": pool, "out": out, "args": args, "rows": rows}


@pytest.mark.slow
def test_build_writes_a_prompt_set_its_provenance_and_its_run(built):
    ps = load_prompts(built["out"])
    prov = json.loads(built["out"].with_name("b.provenance.json").read_text())
    assert len(ps) == 6 and prov["prompt_set"]["sha256"] == ps.sha256
    assert prov["reference"]["kind"] == "hf" and prov["reference"]["versions"]["torch"]
    assert prov["sampling"] == {"max_tokens": 4, "top_logprobs": 5}
    assert prov["pool"]["files"][0]["sha256"] and prov["pool"]["count"] == 16
    chosen = prov["sensitivity"]["prompts"]
    assert [p["id"] for p in chosen] == ps.ids and all(len(p["margins"]) == p["steps"] for p in chosen)
    assert all(set(p["p_flip"]) == {f"{s:g}" for s in prov["sensitivity"]["scales"]} for p in chosen)
    groups = {p["group"] for p in chosen}
    assert len(groups) >= 3  # the coverage floor: one per group while N allows
    run = json.loads((built["dir"] / "b.run" / "manifest.json").read_text())
    assert run["status"] == "complete" and run["records"] == 16


@pytest.mark.slow
def test_a_complete_run_is_reused_and_a_stopped_one_continued(built):
    run = built["dir"] / "b.run"
    before = (run / "records.jsonl").read_bytes()
    again = runner.invoke(app, [*built["args"][:-1], str(built["dir"] / "b.jsonl")])
    assert again.exit_code == 0 and (run / "records.jsonl").read_bytes() == before
    # Stop the run as an engine failure leaves it: manifest "failed", the last records missing.
    lines = before.decode().splitlines(keepends=True)
    (run / "records.jsonl").write_text("".join(lines[:-3]), encoding="utf-8")
    m = json.loads((run / "manifest.json").read_text())
    m.update(status="failed", records=len(lines) - 3, error="killed", failed_prompt=json.loads(lines[-3])["id"])
    (run / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    resumed = runner.invoke(app, built["args"])
    assert resumed.exit_code == 0, resumed.output
    m2 = json.loads((run / "manifest.json").read_text())
    assert m2["status"] == "complete" and m2["resumed"][-1]["kept"] == len(lines) - 3
    def tokens(text):  # the generations, without their wall-clock timing
        return sorted((r["id"], r["token_ids"], r["top_logprobs"]) for r in map(json.loads, text.splitlines()))

    assert tokens((run / "records.jsonl").read_text()) == tokens(before.decode())


@pytest.mark.slow
def test_a_run_of_another_pool_beside_the_output_is_refused(built, tmp_path):
    other = tmp_path / "o.jsonl"
    other.write_text(built["pool"].read_text().replace('"text": "', '"text": "X', 1), encoding="utf-8")
    target = built["dir"] / "b.jsonl"
    r = runner.invoke(app, ["battery", "build", str(other), *built["args"][3:-1], str(target)])
    assert r.exit_code == 2 and "not this build's" in r.output


@pytest.mark.slow
def test_show_prints_the_figures_and_a_gate_runs_on_the_battery(built, tmp_path):
    r = runner.invoke(app, ["battery", "show", str(built["out"]), "--html", str(tmp_path / "b.html")])
    assert r.exit_code == 0, r.output
    assert "expected detection" in r.output and "smallest top-2 margin" in r.output
    assert "random 6 of the pool" in (tmp_path / "b.html").read_text()
    gate = tmp_path / "g.toml"
    gate.write_text(f'prompts = "{built["out"]}"\nmax_tokens = 4\noutput_dir = "{tmp_path / "r"}"\n'
                    '[reference]\nkind = "hf"\nmodel = "bundled:tiny-llama"\n'
                    '[candidate]\nkind = "hf"\nmodel = "bundled:tiny-llama"\n', encoding="utf-8")
    g = runner.invoke(app, ["gate", str(gate)])
    assert g.exit_code == 0, g.output


@pytest.mark.slow
def test_show_refuses_a_set_edited_after_it_was_built(built, tmp_path):
    edited = tmp_path / "b.jsonl"
    edited.write_text(built["out"].read_text().splitlines()[0] + "\n", encoding="utf-8")
    (tmp_path / "b.provenance.json").write_text(built["out"].with_name("b.provenance.json").read_text())
    r = runner.invoke(app, ["battery", "show", str(edited)])
    assert r.exit_code == 2 and "changed after it was built" in r.output
