"""One result, as a property: whatever sections a finished gate holds and whatever a command redoes,
every path that rewrites its reports keeps each section it did not redo, never lets the exit code
improve unless something was judged again, and leaves every format saying the same verdict.

The sections are real: speed from tests/speed_fixtures.py (judged by the real speed judge),
invariance from `strict-gate invariance`'s phase run in process on real command engines
(tests/engines/variant_engine.py: a pass, a move, variants not served, a move beside a variant
not served), noise from the shipped tiny-llama fp32 noise profile judged against each gate's
comparison (judge_noise), drift from measure_drift over the gate's reference records. The gates
are real too: two finished gates (tokens pass; tokens fail) on command engines, run once per module,
so the finished-gate resume path (`gate --resume` of a finished gate) runs on each example.

Hypothesis draws the features a gate holds (a subset, one real section each), its token verdict,
the sections a command redid (and whether the redo changed them) and whether the tokens were judged
again. The paths: keep_sections (in memory), rewrite_reports (every format, the gate state resealed)
and resume_gate of the finished gate; once per module, a real `strict-gate diagnose`.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import speed_fixtures
from helpers import write_gate
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

from strict_gate.drift.measure import measure_drift
from strict_gate.errors import InputError
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.resume import resume_gate
from strict_gate.gate.rewrite import keep_sections, rewrite_reports
from strict_gate.gate.run import run_gate
from strict_gate.gate.state import read_gate_state, record_verdicts, verdicts
from strict_gate.invariance.phase import run_invariance_gate
from strict_gate.invariance.render import beside_line
from strict_gate.invariance.verdict import Pairing
from strict_gate.judge.result import GateResult
from strict_gate.judge.stored import load_report
from strict_gate.noise.annotate import judge_noise
from strict_gate.noise.profile import load_profile
from strict_gate.report import write_reports
from strict_gate.report.console import print_result
from strict_gate.report.text import md
from strict_gate.runs.layout import ReportDir
from strict_gate.runs.records import ScoredStep

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANT = str(HERE / "engines" / "variant_engine.py")
NAMES = ("drift", "invariance", "noise", "speed")

# The documented precedence (docs/reading-a-report.md, "Exit codes and their precedence"), written
# out here, not imported: a non-zero token code first, then FAIL, NOT_INVARIANT, ENGINE_FAILURE,
# SLOWER, BAD_INPUT.
PRECEDENCE = (1, 5, 3, 4, 2)


def expected_exit(token: int, codes) -> int:
    if token:
        return token
    return next((c for c in PRECEDENCE if c in set(codes)), 0)


def rank(code: int) -> int:
    """How serious an exit code is when the token code is fixed: 0 passes, the precedence above."""
    return 0 if code == 0 else len(PRECEDENCE) - PRECEDENCE.index(code)


# ---------------------------------------------------------------------------- real gates and sections


def _prompts(where: Path) -> Path:
    path = where / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "token_ids": [3 + i, 11, 20 + 5 * i, 7, 2 + i]}) + "\n"
                            for i in range(6)), encoding="utf-8")
    return path


def _gate_config(where: Path, *candidate_flags: str, reference_flags: tuple[str, ...] = (), **tables) -> Path:
    where.mkdir(parents=True)
    return write_gate(where, prompts=_prompts(where), max_tokens=4, top_logprobs=2, output_dir=where / "out",
                      policy="strict", reference={"kind": "command", "command": [sys.executable, VARIANT,
                                                                                 *reference_flags]},
                      candidate={"kind": "command", "command": [sys.executable, VARIANT, *candidate_flags],
                                 "timeout_s": 10.0}, **tables)


@pytest.fixture(scope="module")
def gates(tmp_path_factory) -> dict[bool, tuple[Path, GateResult]]:
    """token_fail -> (the finished gate's report directory, its result): no feature enabled, so
    every section a test gives it comes from the pool, and the gate's own run for the resume."""
    tmp = tmp_path_factory.mktemp("gates")
    out = {}
    for fail, flags in ((False, ()), (True, ("--shift", "1"))):
        outcome = run_gate(load_gate_config(_gate_config(tmp / f"fail-{fail}", *flags)))
        assert outcome.result.verdict.verdict == ("fail" if fail else "pass") and not outcome.result.features
        out[fail] = (Path(outcome.report_dir), outcome.result)
    return out


def _invariance(tmp: Path, name: str, invariance: dict, *flags: str, reference: tuple[str, ...] = ()):
    cfg = load_gate_config(_gate_config(tmp / name, *flags, reference_flags=reference,
                                        invariance={"policy": "strict"} | invariance))
    return run_invariance_gate(cfg).result


def _scored(r) -> list[ScoredStep]:
    """The candidate's scoring of the reference tokens: each step's top-k, the winner 0.2 nats lower."""
    return [ScoredStep(token_id=t, logprob=top[0][1] - 0.2, top=tuple((x, lp - 0.2) for x, lp in top))
            for t, top in zip(r.token_ids, r.top_logprobs or ())]


@pytest.fixture(scope="module")
def pool(tmp_path_factory, gates) -> dict[str, list]:
    """name -> real sections of that feature, of every exit code each can give."""
    tmp = tmp_path_factory.mktemp("pool")
    inv = [
        _invariance(tmp, "pass", {"batch": [4]}, "--mode", "invariant"),
        _invariance(tmp, "moved", {"batch": [4]}, "--mode", "in_flight"),
        _invariance(tmp, "unserved", {"batch": [4], "prefix_cache": True}, "--mode", "invariant", "--max-in-flight",
                    "1", "--no-cache"),
        _invariance(tmp, "moved-and-unserved", {"batch": [4], "chunked_prefill": [2]}, "--mode", "in_flight",
                    "--no-chunk"),
        # both arms (issue 52): the candidate moves with the reference (a yardstick beside a pass),
        # then where the reference moves half the prompts alone
        *(_invariance(tmp, f"beside-{k}", {"arms": ["candidate", "reference"], "chunked_prefill": [2]}, "--mode",
                      "chunk", reference=("--mode", "chunk", *more)) for k, more in enumerate(((), ("--every", "2")))),
    ]
    assert [int(x.exit_code) for x in inv] == [0, 5, 3, 3, 0, 5], [x.verdict_line for x in inv]
    speed = [speed_fixtures.speed(case) for case in speed_fixtures.CASES]
    assert {int(s.exit_code) for s in speed} == {0, 3, 4}
    profile_path = ROOT / "baselines" / "tiny-llama-vllm-fp32" / "noise.json"
    profile = load_profile(profile_path)
    noise = [judge_noise(profile, str(profile_path), r.comparison, band=0.5, band_rule=rule,
                         dtypes={"reference": "float32", "candidate": "bfloat16"})
             for _, r in gates.values() for rule in (None, "the profile's largest self-flip gap")]
    drift = [measure_drift(r.reference_records, sorted(r.reference_records), _scored, k=2, band=0.5, scored_by="hand")
             for _, r in gates.values()]
    assert any(n.flips for n in noise) and all(d.positions for d in drift)
    return {"speed": speed, "invariance": inv, "noise": noise, "drift": drift}


# ---------------------------------------------------------------------------- what every format says


def section_json(r_doc: dict) -> dict[str, str]:
    return {n: json.dumps(s, sort_keys=True) for n, s in r_doc["features"].items()}


def expected_heading(r: GateResult) -> str:
    """The documented heading: the token verdict when the tokens fail or the gate passes, else
    FAIL (or INCOMPLETE for exit 3) and the section (first by name) whose code the gate exits with."""
    code = expected_exit(int(r.verdict.exit_code), [int(s.exit_code) for s in r.features.values()])
    if code == 0 or int(r.verdict.exit_code) != 0:
        return str(r.verdict.verdict).upper()
    name = min(n for n, s in r.features.items() if int(s.exit_code) == code)
    return ("INCOMPLETE" if code == 3 else "FAIL") + f" ({name})"


def own_line(name: str, r: GateResult) -> str | None:
    """A section's own verdict line as the console prints it; None for an informational one."""
    if name == "invariance":
        return r.features[name].verdict_line
    if name == "speed":
        from strict_gate.speed.view import of

        return of(r).verdict_line
    return None


def console_text(r: GateResult) -> str:
    buf = io.StringIO()
    print_result(r, Console(file=buf, width=200, force_terminal=False, color_system=None))
    return buf.getvalue()


def assert_console_agrees(text: str, r: GateResult) -> None:
    lines = text.splitlines()
    assert any(ln.startswith(f"{str(r.verdict.verdict).upper()}  policy ") for ln in lines), text
    for name in r.features:
        line = own_line(name, r)
        if line is not None:
            assert " ".join(line.split()) in " ".join(text.split()), (name, line, text)
    heading = expected_heading(r)
    if "(" in heading:  # the section that sets the exit code says so on the console
        name = heading.split("(", 1)[1].rstrip(")")
        assert own_line(name, r) is not None


def assert_formats_agree(d: Path, r: GateResult) -> None:
    """report.md, report.html, report.json, junit.xml and the console say the verdict the exit code says."""
    code = expected_exit(int(r.verdict.exit_code), [int(s.exit_code) for s in r.features.values()])
    assert int(r.exit_code) == code
    heading = expected_heading(r)
    assert (d / "report.md").read_text(encoding="utf-8").splitlines()[0].startswith(f"# {heading}: ")
    page = (d / "report.html").read_text(encoding="utf-8")
    banner = re.search(r'<div class="banner"[^>]*>(.*?)</div>', page, re.S)
    assert banner is not None and banner.group(1).startswith(f"{heading}: "), banner and banner.group(1)
    doc = json.loads((d / "report.json").read_text(encoding="utf-8"))
    assert (doc["exit_code"], doc["overall"]) == (code, heading.lower())
    assert {n: (s["verdict"], s["exit_code"]) for n, s in doc["features"].items()} == {
        n: (s.section_verdict, int(s.exit_code)) for n, s in r.features.items()}
    suite = ET.parse(d / "junit.xml").getroot()
    failures, errors = int(suite.get("failures")), int(suite.get("errors"))
    # What holds: a failing or incomplete gate has a failing or erroring case, a passing one none;
    # a measured failure (tokens, slower, moved) is a <failure>, an incomplete one an <error>.
    assert (failures + errors == 0) == (code == 0), (code, failures, errors)
    if code in (1, 4, 5):
        assert failures >= 1, (code, failures, errors)
    if code == 3:
        assert errors >= 1, (code, failures, errors)
    assert_console_agrees(console_text(r), r)
    assert_moves_said(d, r)


def assert_moves_said(d: Path, r: GateResult) -> None:
    """A candidate variant judged beside the reference's: its classes counted in every format,
    each prompt under its class in report.json."""
    inv = r.features.get("invariance")
    for v in inv.variants if inv is not None else ():
        line = beside_line(v)
        if line is None:
            continue
        page = html.unescape((d / "report.html").read_text(encoding="utf-8"))
        junit = " ".join(x.text or "" for x in ET.parse(d / "junit.xml").getroot().iter())
        said = {"report.md": (d / "report.md").read_text(encoding="utf-8"), "report.html": page, "junit.xml": junit,
                "console": console_text(r)}
        for f, text in said.items():
            want = md(line) if f == "report.md" else line
            assert " ".join(want.split()) in " ".join(text.split()), (f, line)
        doc = json.loads((d / "report.json").read_text(encoding="utf-8"))
        (body,) = [x for x in doc["features"]["invariance"]["section"]["variants"]
                   if (x["arm"], x["name"]) == (v.arm, v.name)]
        assert {k: ids for k, ids in body["beside_reference"].items() if ids} == {
            k.value: v.paired_ids(k) for k in Pairing if v.paired_ids(k)}


# ---------------------------------------------------------------------------- the property


def _finished_copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("gate.lock"))
    return dest


@st.composite
def cases(draw):
    token_fail = draw(st.booleans())
    names = draw(st.sets(st.sampled_from(NAMES)))
    picks = {n: draw(st.integers(0, 7)) for n in sorted(names)}
    redone = draw(st.sets(st.sampled_from(NAMES)))  # a name the gate lacks: the command added that section
    changed = {n: draw(st.integers(0, 7)) for n in sorted(redone) if draw(st.booleans())}
    rejudge_tokens = draw(st.booleans())  # in memory only: the runs on disk judge as they judge
    vandal = (draw(st.sampled_from(NAMES)), draw(st.sampled_from(("delete", "zero"))))  # a hostile edit, last
    return token_fail, picks, redone, changed, rejudge_tokens, vandal


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_every_rewrite_keeps_what_it_did_not_redo_and_every_format_agrees(case, gates, pool, tmp_path_factory):
    token_fail, picks, redone, changed, rejudge_tokens, (victim, how) = case
    src, base = gates[token_fail]
    d = _finished_copy(src, tmp_path_factory.mktemp("ex") / src.name)
    report = ReportDir(d)
    # the finished gate with the drawn sections, written as a gate writes it (state sealed, then reports)
    before = replace(base, features={n: pool[n][i % len(pool[n])] for n, i in picks.items()})
    event(f"exit code before: {int(before.exit_code)}")
    record_verdicts(report, read_gate_state(report), verdicts(before), before.exit_code)
    write_reports(before, d)
    assert_formats_agree(d, before)
    old_doc = json.loads(report.report_json.read_text(encoding="utf-8"))
    old_sections = section_json(old_doc)
    assert set(old_sections) == set(picks)
    old = load_report(report.report_json)

    # what the command redid: each redone section again (the same, or judged again to another)
    redo = {n: pool[n][changed[n] % len(pool[n])] if n in changed else before.features.get(n, pool[n][0])
            for n in redone}
    new = replace(base, features=redo)
    new_codes = [int(s.exit_code) for s in redo.values()]
    kept_codes = [int(s.exit_code) for n, s in before.features.items() if n not in redone]
    same_sections = all(redo[n] is before.features.get(n) for n in redone if n in before.features)

    # 1. keep_sections, in memory, the tokens judged again (the other gate's verdict) or not
    judged = replace(new, verdict=gates[not token_fail][1].verdict) if rejudge_tokens else new
    kept = keep_sections(judged, old, redone=redone, where=str(report.report_json))
    assert set(kept.features) == set(before.features) | set(redo)
    for n in set(before.features) - set(redone):
        assert json.dumps(kept.features[n].to_json(), sort_keys=True) == json.dumps(
            json.loads(old_sections[n])["section"], sort_keys=True), n
    assert int(kept.exit_code) == expected_exit(int(judged.verdict.exit_code), kept_codes + new_codes)
    if not rejudge_tokens and same_sections and set(redo) <= set(before.features):
        assert kept.exit_code == before.exit_code  # nothing judged again: nothing changes

    # 2. rewrite_reports: every format rewritten, the gate state resealed
    outcome = rewrite_reports(d, new, old, redone=redone)
    after = outcome.result
    new_doc = json.loads(report.report_json.read_text(encoding="utf-8"))
    new_sections = section_json(new_doc)
    assert set(new_sections) >= set(old_sections) and set(new_sections) == set(old_sections) | set(redo)
    for n in set(old_sections) - set(redone):
        assert new_sections[n] == old_sections[n], n  # kept as the gate wrote it
    assert int(after.exit_code) == expected_exit(int(new.verdict.exit_code), kept_codes + new_codes)
    if same_sections:  # the same runs' token verdict, no section judged again: the code never improves
        assert rank(int(after.exit_code)) >= rank(int(before.exit_code)), (before.exit_code, after.exit_code)
    assert_formats_agree(d, after)
    assert read_gate_state(report).exit_code == int(after.exit_code)

    # 3. gate --resume of the finished gate: its stored verdicts, its sections as report.json holds them
    written = report.report_json.read_bytes()
    resumed = resume_gate(d)
    assert resumed.finished_already and int(resumed.exit_code) == int(after.exit_code)
    assert int(resumed.outcome.result.exit_code) == int(after.exit_code)
    assert {n: json.dumps(s.to_json(), sort_keys=True) for n, s in resumed.outcome.result.features.items()} == {
        n: json.dumps(json.loads(t)["section"], sort_keys=True) for n, t in new_sections.items()}
    assert verdicts(resumed.outcome.result) == read_gate_state(report).verdicts
    assert_console_agrees(console_text(resumed.outcome.result), resumed.outcome.result)
    assert report.report_json.read_bytes() == written  # a finished gate's reports are left as they were

    # 4. report.json edited so a section is gone or says it passed: refused naming report.json, never
    # rewritten (a rewrite would drop that verdict or read it as a pass)
    hostile = json.loads(written)
    if victim in hostile["features"] and (how == "delete" or hostile["features"][victim]["exit_code"]):
        event(f"hostile edit refused: {how}")
        if how == "delete":
            del hostile["features"][victim]
        else:
            hostile["features"][victim]["exit_code"] = 0
        text = (json.dumps(hostile, indent=2) + "\n").encode()
        report.report_json.write_bytes(text)
        with pytest.raises(InputError) as e:
            rewrite_reports(d, base, load_report(report.report_json), redone=())
        assert str(report.report_json) in str(e.value) and f"{victim}" in str(e.value), str(e.value)
        assert report.report_json.read_bytes() == text
        assert read_gate_state(report).exit_code == int(after.exit_code)


# ---------------------------------------------------------------------------- a real diagnose, once


def test_a_real_diagnose_keeps_every_section_and_every_format_agrees(gates, pool, tmp_path):
    """Each feature's most serious section at once in the finished gate whose tokens pass, then
    `strict-gate diagnose` as a subprocess: the sections kept byte for byte, exit 5 (NOT_INVARIANT
    over ENGINE_FAILURE and SLOWER), every format and the console saying so."""
    src, base = gates[False]
    d = _finished_copy(src, tmp_path / src.name)
    report = ReportDir(d)
    worst = {n: max(pool[n], key=lambda s: rank(int(s.exit_code))) for n in NAMES}
    before = replace(base, features=worst)
    record_verdicts(report, read_gate_state(report), verdicts(before), before.exit_code)
    write_reports(before, d)
    old_sections = section_json(json.loads(report.report_json.read_text(encoding="utf-8")))
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "diagnose", str(d)], capture_output=True, text=True,
                       timeout=300, env=os.environ | {"COLUMNS": "200"})
    assert p.returncode == 5 == int(before.exit_code), p.stdout + p.stderr
    assert section_json(json.loads(report.report_json.read_text(encoding="utf-8"))) == old_sections
    assert_formats_agree(d, before)
    assert_console_agrees(p.stdout, before)
    assert resume_gate(d).exit_code == 5


@pytest.mark.parametrize("k", [-2, -1])
def test_a_real_diagnose_and_resume_keep_the_moves_beside_the_reference(gates, pool, tmp_path, k):
    """A candidate variant judged beside the reference's (issue 52: all its moves shared, then half
    its own): `strict-gate diagnose` keeps the section byte for byte, every format still says each
    class, and `gate --resume` of the finished gate reads the same classes back."""
    src, base = gates[False]
    d = _finished_copy(src, tmp_path / src.name)
    report = ReportDir(d)
    inv = pool["invariance"][k]
    assert inv.variants[0].pairs, inv.verdict_line
    before = replace(base, features={"invariance": inv})
    record_verdicts(report, read_gate_state(report), verdicts(before), before.exit_code)
    write_reports(before, d)
    old_sections = section_json(json.loads(report.report_json.read_text(encoding="utf-8")))
    p = subprocess.run([sys.executable, "-m", "strict_gate.cli", "diagnose", str(d)], capture_output=True, text=True,
                       timeout=300, env=os.environ | {"COLUMNS": "200"})
    assert p.returncode == int(before.exit_code), p.stdout + p.stderr
    assert section_json(json.loads(report.report_json.read_text(encoding="utf-8"))) == old_sections
    assert_formats_agree(d, before)
    resumed = resume_gate(d)
    assert resumed.outcome.result.features["invariance"] == inv
