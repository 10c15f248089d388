"""junit.xml: one test case per prompt, so CI systems show which prompts failed, and one `speed`
test case when the gate measured speed (failed below min_speed_ratio or not comparable, an error
when unmeasured).

Every string goes through visible(): XML 1.0 cannot hold most control characters at all, so an
id or an engine error holding ESC or NUL would otherwise make the whole file unreadable to CI.
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

from strict_gate.judge.compare import UNCOMPARED
from strict_gate.judge.result import GateResult
from strict_gate.judge.tally import headline_text
from strict_gate.report.sections import in_order
from strict_gate.report.text import visible


def _text(s: str) -> str:
    return visible(s, keep_newlines=True)


def render(r: GateResult) -> str:
    verdicts = {v.id: v for v in r.verdict.prompts}
    per_prompt = [section(r) for section in in_order("junit_prompts")]  # each section's system-out lines
    cls = visible(f"strict-gate.{r.name}")
    caveat = r.verdict.rule.caveat
    suite = ET.Element("testsuite", name=cls, tests="0", failures="0", errors="0", skipped="0")  # counted last
    props = ET.SubElement(suite, "properties")
    for k, val in (
        ("verdict", r.verdict.verdict),
        ("policy", r.verdict.policy),
        *((("policy_note", caveat),) if caveat else ()),
        ("band", str(r.verdict.band)),
        ("prompt_set_sha256", str(r.prompt_set.get("sha256"))),
        ("counts", headline_text(r.comparison.summary.counts, r.flips)),
        *(prop for section in in_order("junit_properties") for prop in section(r)),
    ):
        ET.SubElement(props, "property", name=k, value=visible(val))
    for p in r.comparison.prompts:
        v = verdicts[p.id]
        case = ET.SubElement(suite, "testcase", classname=cls, name=visible(p.id))
        if p.status in UNCOMPARED:
            ET.SubElement(case, "error", message=p.status).text = _text(v.reason)
        elif v.unverified:  # never a pass, not a measured failure: an error, as an incomplete gate is
            ET.SubElement(case, "error", message="unverified").text = _text(v.reason)
        elif not v.passed:
            ET.SubElement(case, "failure", message=p.status).text = _text(v.reason)
        out = [line for part in per_prompt for line in part.get(p.id, ())]
        if out:  # one system-out per case: the later judgement and the noise placement together
            ET.SubElement(case, "system-out").text = _text("\n".join(out))
    if r.verdict.verdict == "incomplete" and not r.comparison.prompts:
        case = ET.SubElement(suite, "testcase", classname=cls, name="gate")
        ET.SubElement(case, "error", message="incomplete").text = _text("; ".join(r.verdict.reasons))
    for section in in_order("junit_cases"):
        section(suite, r, cls)
    return suite_xml(suite)


def suite_xml(suite: ET.Element) -> str:
    """The suite's text, its counts taken from the cases it holds, so a count never disagrees."""
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
