"""The speed arm in every report format: both arms per rung by role with their kinds beneath,
the ratio in words with its 95 % interval, "not separable" when the interval holds 1.0, the match check with flattering mismatches called out,
and the speed verdict on its own line, never changing the token verdict."""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import replace
from xml.etree import ElementTree as ET

import pytest
from helpers import rec, section, write_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from speed_fixtures import CASES, FLATTERING, RUNGS, arm, gate, speed
from typer.testing import CliRunner

from strict_gate.cli import app
from strict_gate.judge.result import overall_exit_code
from strict_gate.report import html, junit, markdown, write_reports
from strict_gate.report.console import print_result
from strict_gate.report.text import md
from strict_gate.speed import view as speed_view
from strict_gate.speed.model import (
    ArmFigures,
    Figure,
    Method,
    Mismatch,
    RungResult,
    SpeedResult,
    SpeedVerdict,
    SpeedVerdictKind,
    TokenCheck,
)
from strict_gate.speed.verdict import judge_speed

runner = CliRunner()

# What each case must say, in every format that shows words.
SAYS = {
    "pass": ["speed: pass (min_speed_ratio decode 0.95x)", "decode 0.97x vLLM [0.96, 0.98]", "TTFT 1.33x [1.26, 1.41]",
             "matched: yes", "gpu clocks not locked", "timed tokens: 12 replies checked", "all verified",
             "a TTFT ratio below 1 is faster", "95 % interval", "5 runs after 1 warmup",
             "arms one after the other"],
    "fail": ["speed: fail (min_speed_ratio decode 0.95x)", "decode 0.81x vLLM [0.80, 0.82]",
             "rung 128/128: decode speed 0.81x reference [0.80, 0.82] < 0.95x"],
    "incomplete": ["speed: incomplete (min_speed_ratio decode 0.95x)", "not measured: candidate: connection refused"],
    "not-separable": ["speed: not separable (min_speed_ratio decode 0.95x)",
                      "decode 1.00x vLLM [0.93, 1.07] not separable", "TTFT 1.02x [0.94, 1.11] not separable",
                      "rung 128/128: decode speed 1.00x reference [0.93, 1.07] is not separable from the bar 0.95x "
                      "at 5 runs; about 6 runs per arm would separate it (estimated from the spread)"],
    "flattering": ["matched: no (1 difference, 1 flattering denominator",
                   "dtype: vLLM bfloat16, candidate float16 — flattering denominator (the candidate computes in fp16)",
                   "speed: not comparable (min_speed_ratio decode 0.95x)",
                   "not comparable: dtype (the candidate computes in fp16; reference 'bfloat16', candidate 'float16')"],
    "informational": ["speed: informational (no min_speed_ratio", "method two-request", "5 runs after 1 warmup"],
}


def console_lines(result, width: int = 80) -> list[str]:
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=width, color_system=None))
    return buf.getvalue().splitlines()


def unescaped_pipes(line: str) -> int:
    """'|' not escaped by a backslash (an escaped backslash before it does not escape it)."""
    return sum(1 for m in re.finditer(r"(\\*)\|", line) if len(m.group(1)) % 2 == 0)


def speed_table(text: str) -> list[str]:
    """report.md's speed table: its header, rule and rows."""
    section = text[text.index("## Speed"):]
    lines = section.split("\n")  # CommonMark ends a line at \n only, not at U+2028
    start = next(i for i, line in enumerate(lines) if line.startswith("| rung |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


def test_report_json_has_wall_clock_and_the_speed_object(tmp_path):
    for case in ("fail", None):
        s = speed(case) if case else None
        out = tmp_path / str(case)
        write_reports(gate(s), out, formats=("json",))
        rep = json.loads((out / "report.json").read_text())
        assert set(rep["wall_clock"]) == {"reference", "candidate"}
        assert section(rep, "speed") == (None if s is None else json.loads(json.dumps(s.to_json())))
    assert section(rep, "speed") is None and rep["verdict"] == "pass"


def test_non_finite_figures_are_null_in_strict_json_and_shown_as_unknown(tmp_path):
    """A reference sample of almost 0 tok/s makes a ratio's upper end infinite; a NaN sample, a NaN median."""
    bad = ArmFigures(Figure((0.02,)), Figure((1e-310, 100.0, 101.0)), Figure((math.nan,)), tokens=128,
                     self_reported={"x": math.inf})
    good = arm({"ttft_s": (0.02,), "decode_tok_s": (90.0, 91.0), "e2e_tok_s": (80.0,)})
    rungs = (RungResult(RUNGS[0], bad, good),)
    s = SpeedResult(Method.STREAM, 2, 0, rungs, (), judge_speed(rungs, {"decode": 0.9}, method=Method.STREAM))
    write_reports(gate(s), tmp_path, formats=("json", "md", "html", "junit"))
    text = (tmp_path / "report.json").read_text()
    rep = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    rung = section(rep, "speed")["rungs"][0]
    assert rung["ratio"]["decode_tok_s"]["interval"][1] is None and rung["reference"]["e2e_tok_s"]["median"] is None
    assert rung["reference"]["self_reported"] == {"x": None}
    assert md("decode 0.91x vLLM [0.89, ?] not separable") in (tmp_path / "report.md").read_text()
    assert "| – |" in speed_table((tmp_path / "report.md").read_text())[3]  # the NaN e2e figure, beneath the kinds


@pytest.mark.parametrize("case", CASES)
def test_markdown_speed_section(case):
    r = gate(speed(case))
    text = markdown.render(r)
    view = speed_view.of(r)
    # the heading says what the exit code says: the tokens pass, so a speed verdict that sets the
    # code names the speed section; the token verdict is the line under it, unchanged
    heading = {0: "PASS", 4: "FAIL (speed)", 3: "INCOMPLETE (speed)"}[int(r.exit_code)]
    assert text.startswith(f"# {heading}: speedy"), text[:80]
    assert "\nVerdict **pass** under policy" in text
    head = markdown.summary(r)
    assert f"\n{md(view.verdict_line)}; see Speed below.\n" in head  # its own line, in the job summary too
    table = speed_table(text)
    assert len(table) == 3 + len(RUNGS)  # header, rule, the arms' kinds, a row per rung
    assert {unescaped_pipes(line) for line in table} == {len(view.columns()) + 1}
    assert "| decode tok/s reference | decode tok/s candidate | TTFT ms reference |" in table[0]
    assert table[2].startswith("| *engine* | *vLLM* | *openai* | *vLLM* |")
    assert table[3].startswith("| 128/128 | 101 (100–102) | ")
    for words in SAYS[case]:
        assert md(words) in text, words
    assert "rung 128/128 candidate: vllm:gpu\\_cache\\_usage 0.4" in text  # self-reported, beside
    if case == "flattering":
        assert f"- **{md(SAYS['flattering'][1])}**" in text


def test_no_speed_means_no_section_in_any_format():
    r = gate(None)
    assert "Speed" not in markdown.render(r) and "speed:" not in markdown.render(r)
    assert "id='speed'" not in html.render(r) and "class='speedv" not in html.render(r)
    assert not any("speed" in line for line in console_lines(r))
    suite = ET.fromstring(junit.render(r))
    assert [c.get("name") for c in suite.iter("testcase")] == ["a", "b", "c"] and suite.get("tests") == "3"


@pytest.mark.parametrize("case", CASES)
def test_html_speed_section(case):
    page = html.render(gate(speed(case)))
    section = page[page.index("<h2 id='speed'>"):page.index("<h2>Engines</h2>")]
    assert section.count("<tr>") == 1 + len(RUNGS)
    verdict = speed(case).verdict.kind.value
    said = verdict.replace("_", " ")
    assert f"<main>\n<p class='speedv {verdict}'><a href='#speed'>speed: {said}" in page  # under the banner
    for words in SAYS[case]:
        assert html.escape(words) in section, words
    if case == "not-separable":
        assert section.count("<td class='ns'>") == len(RUNGS)
    if case == "flattering":
        assert "<li class='flat'>dtype: vLLM bfloat16" in section


@pytest.mark.parametrize("case", CASES)
def test_console_speed_fits_80_columns(case):
    lines = console_lines(gate(speed(case), diverge=True))
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert lines[0].strip() == "strict-gate: speedy" and "FAIL  policy strict" in text  # the token verdict first
    verdict = next(line for line in lines if line.startswith("speed: "))
    assert verdict == speed_view.of(gate(speed(case))).verdict_line
    rows = [line for line in lines if "decode tok/s" in line]
    assert len(rows) == len(RUNGS)
    if case == "not-separable":
        assert all(line.rstrip().endswith("not separable") for line in rows)
    if case == "pass":
        assert re.search(r"128/128 +decode tok/s +101 +98\.0 +0\.97x \[0\.96, 0\.98\]", text)
        assert re.search(r"ref +cand *\n rung +figure +vLLM +openai +cand/ref", text)
    if case == "incomplete":
        assert "1024/128@4: decode not measured (candidate: connection refused)" in text
    assert "self-reported, never used: rung 128/128 candidate: vllm:gpu_cache_usage 0.4" in text


@pytest.mark.parametrize("case, outcome", [("pass", None), ("informational", None), ("not-separable", "error"),
                                           ("fail", "failure"), ("incomplete", "error"), ("flattering", "failure")])
def test_junit_speed_case(case, outcome):
    suite = ET.fromstring(junit.render(gate(speed(case), diverge=True)))
    (sp,) = [c for c in suite.iter("testcase") if c.get("name") == "speed"]
    assert [c.tag for c in sp if c.tag in ("failure", "error")] == ([outcome] if outcome else [])
    assert "rung 128/128: decode" in sp.find("system-out").text
    assert suite.get("tests") == "4"
    assert suite.get("failures") == str(1 + (outcome == "failure"))  # prompt b, and speed when below the bar
    assert suite.get("errors") == str(int(outcome == "error"))
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    want = {"not-separable": "not_separable", "flattering": "not_comparable"}.get(case, case)
    assert props["speed_verdict"] == want and props["verdict"] == "fail"


def test_show_prints_the_speed_arm_from_report_json(tmp_path):
    for role in ("reference", "candidate"):
        write_run(tmp_path / role, [rec(i, [5, 6, 7, 8]) for i in "abc"])
    write_reports(gate(speed("flattering")), tmp_path, formats=("json",))
    r = runner.invoke(app, ["show", str(tmp_path)], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "all 3 prompts match token for token" in r.output and "speed: not comparable (min_speed_ratio" in r.output
    assert "flattering denominator" in r.output and "1024/128@4" in r.output
    # a report written before `wall_clock` had its own key: the old per-arm `speed` is not a speed arm
    rep = json.loads((tmp_path / "report.json").read_text())
    rep["speed"] = rep.pop("wall_clock")
    rep["schema"] = "strict-gate/report@1"  # as such a report said (report@3 keeps the speed arm under features)
    del rep["features"]
    (tmp_path / "report.json").write_text(json.dumps(rep))
    r = runner.invoke(app, ["show", str(tmp_path)], terminal_width=80)
    assert r.exit_code == 0 and "speed:" not in r.output


@pytest.mark.parametrize("token, kind, expected", [
    (0, None, 0), (1, None, 1), (3, None, 3),
    (0, SpeedVerdictKind.PASS, 0), (0, SpeedVerdictKind.INFORMATIONAL, 0),
    (0, SpeedVerdictKind.FAIL, 4), (0, SpeedVerdictKind.INCOMPLETE, 3),
    (1, SpeedVerdictKind.PASS, 1), (1, SpeedVerdictKind.FAIL, 1), (3, SpeedVerdictKind.FAIL, 3),
])
def test_overall_exit_code(token, kind, expected):
    s = None if kind is None else replace(speed("pass"), verdict=SpeedVerdict(kind, {}))
    assert overall_exit_code(token, () if s is None else (s,)) == expected


def test_gate_exit_code_takes_the_speed_verdict_only_when_the_tokens_pass():
    # not separable: 3, never a pass; flattering: not comparable, 4
    assert [gate(speed(c)).exit_code for c in CASES] == [0, 4, 3, 3, 4, 0]
    assert gate(speed("fail"), diverge=True).exit_code == 1
    assert gate(None).exit_code == 0


floats = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.floats(min_value=0, max_value=1e6)
figure = st.lists(floats, max_size=4).map(lambda xs: Figure(tuple(xs)))
text = st.text(max_size=30)
arms = st.builds(ArmFigures, figure, figure, figure, st.integers(0, 10**6),
                 st.none() | st.dictionaries(text, floats | text, max_size=3)) | st.none()


token_checks = st.builds(TokenCheck, st.integers(0, 5), st.lists(text, max_size=2).map(tuple), st.integers(0, 5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rungs=st.lists(st.tuples(text, arms, arms, st.none() | text, token_checks), max_size=3),
       mismatches=st.lists(st.builds(Mismatch, text, text | floats, text, st.booleans(), text), max_size=2),
       machine=text, bars=st.dictionaries(st.sampled_from(["decode", "ttft", "e2e"]), floats, max_size=2),
       method=st.sampled_from(list(Method)))
def test_any_figures_render_in_every_format(tmp_path_factory, rungs, mismatches, machine, bars, method):
    results = tuple(RungResult(replace(RUNGS[0], name=n), ref, cand, err, tc) for n, ref, cand, err, tc in rungs)
    s = SpeedResult(method, 3, 1, results, tuple(mismatches),
                    judge_speed(results, bars, method=method, mismatches=mismatches), machine=machine)
    if s.verdict.kind is SpeedVerdictKind.PASS:  # never past a flattering mismatch or an unverified reply
        assert not any(m.flattering for m in mismatches)
        assert all(r.token_check.verified for r in results)
    r = gate(s)
    out = tmp_path_factory.mktemp("any")
    write_reports(r, out)
    json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    ET.fromstring((out / "junit.xml").read_text(encoding="utf-8"))
    table = speed_table((out / "report.md").read_text())
    assert len(table) == 3 + len(results)  # header, rule, kinds
    assert {unescaped_pipes(line) for line in table} == {len(speed_view.of(r).columns()) + 1}
    assert max(cell_len(line) for line in console_lines(r)) <= 80  # columns: a zero-width character takes none
    assert "<script" not in (out / "report.html").read_text()


def test_hostile_text_is_escaped_everywhere():
    evil = "<script>x</script> | `a` \x1b[31m\nnext"
    s = speed("flattering")
    s = replace(s, machine=evil, mismatches=(replace(FLATTERING, message=evil, candidate=evil),),
                rungs=(replace(s.rungs[0], rung=replace(RUNGS[0], name=evil), error=evil),))
    r = gate(s)
    page = html.render(r)
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page and "\x1b" not in page
    table = speed_table(markdown.render(r))
    assert len(table) == 4 and {unescaped_pipes(line) for line in table} == {9}
    assert not any("\x1b" in line for line in console_lines(r))
    assert "\x1b" not in junit.render(r)


def test_a_pass_across_mismatched_configs_names_every_difference_in_every_format(tmp_path):
    """Another attention backend (not flattering: the ratio passes) and another device (flattering):
    each is named in the speed verdict's own line and reasons in md, html, junit, JSON and the
    console; a ratio across mismatched configs never reads as meeting vLLM's speed at its config."""
    from strict_gate.speed.matched import check_matched
    from strict_gate.speed.measure import ArmMeasurement

    ref = ArmMeasurement("vllm", {"attention_backend": "FLASH_ATTN", "device": "cuda"}, False, {})
    for cand_settings, kind in (({"attention_backend": "TRITON_ATTN", "device": "cuda"}, "pass"),
                                ({"attention_backend": "FLASH_ATTN", "device": "cpu"}, "not_comparable")):
        mismatches, _ = check_matched(ref, ArmMeasurement("vllm", cand_settings, False, {}), ())
        base = speed("pass")
        s = replace(base, mismatches=mismatches, verdict=judge_speed(base.rungs, {"decode": 0.95},
                                                                     method=base.method, mismatches=mismatches))
        assert s.verdict.kind.value == kind
        field = mismatches[0].field
        out = tmp_path / field
        write_reports(gate(s), out, formats=("json", "md", "html", "junit"))
        line = speed_view.of(gate(s)).verdict_line
        assert line.endswith(f"config differs: {field}")
        for name in ("report.md", "report.html", "junit.xml"):
            text = (out / name).read_text()
            said = md(f"config differs: {field}") if name.endswith(".md") else f"config differs: {field}"
            assert said in text, (name, field)
        reasons = section(json.loads((out / "report.json").read_text()), "speed")["speed_verdict"]["reasons"]
        assert any(field in r and ("not at a matched config" in r or "not comparable" in r) for r in reasons)
        assert any(f"config differs: {field}" in x for x in console_lines(gate(s), width=200))
