"""junit.xml: one test case per prompt, so CI systems show which prompts failed.

Every string goes through visible(): XML 1.0 cannot hold most control characters at all, so an
id or an engine error holding ESC or NUL would otherwise make the whole file unreadable to CI.
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

from strict_gate.report.drift_view import junit_properties
from strict_gate.report.result import GateResult
from strict_gate.report.text import visible


def _text(s: str) -> str:
    return visible(s, keep_newlines=True)


def render(r: GateResult) -> str:
    verdicts = {v.id: v for v in r.verdict.prompts}
    failures = sum(1 for p in r.comparison.prompts if p.status not in ("missing", "error") and not verdicts[p.id].passed)
    errors = sum(1 for p in r.comparison.prompts if p.status in ("missing", "error"))
    cls = visible(f"strict-gate.{r.name}")
    suite = ET.Element(
        "testsuite",
        name=cls,
        tests=str(len(r.comparison.prompts)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
    )
    props = ET.SubElement(suite, "properties")
    for k, val in (
        ("verdict", r.verdict.verdict),
        ("policy", r.verdict.policy),
        ("band", str(r.verdict.band)),
        ("prompt_set_sha256", str(r.prompt_set.get("sha256"))),
        *junit_properties(r.drift),
    ):
        ET.SubElement(props, "property", name=k, value=visible(val))
    for p in r.comparison.prompts:
        v = verdicts[p.id]
        case = ET.SubElement(suite, "testcase", classname=cls, name=visible(p.id))
        if p.status in ("missing", "error"):
            ET.SubElement(case, "error", message=p.status).text = _text(v.reason)
        elif not v.passed:
            ET.SubElement(case, "failure", message=p.status).text = _text(v.reason)
    if r.verdict.verdict == "incomplete" and not r.comparison.prompts:
        case = ET.SubElement(suite, "testcase", classname=cls, name="gate")
        ET.SubElement(case, "error", message="incomplete").text = _text("; ".join(r.verdict.reasons))
        suite.set("tests", "1")
        suite.set("errors", "1")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
