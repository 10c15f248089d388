"""The slow tier's list (tests/tiers.py) names tests that exist, each with why CI may leave it out and
the CI-tier tests (or fast acceptance steps) that keep its defence: those exist and are not slow."""

import subprocess
import sys
import tomllib
from pathlib import Path

from tiers import FULL

ROOT = Path(__file__).resolve().parents[1]


def _collected(marks: str, files: set[str]) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marks, *sorted(files)],
                         cwd=ROOT, capture_output=True, text=True, check=False).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


def test_every_test_in_the_slow_tier_exists_and_says_why():
    collected = _collected("full", {k.split("::")[0] for k in FULL})
    assert sorted(set(FULL) - collected) == []
    assert all(slow.why.strip() and slow.ci for slow in FULL.values())


def test_every_slow_test_names_ci_tests_that_exist_and_are_not_slow():
    """The claim that the tier never holds a defence's only test, checked: each named CI test is
    collected by CI's own selection (`-m "not full"`), a function's id by at least one of its
    parameters; each acceptance step named is of the fast tier."""
    refs = {ref for slow in FULL.values() for ref in slow.ci}
    tests = {ref for ref in refs if not ref.startswith("acceptance:")}
    ci = _collected("not full", {ref.split("::")[0] for ref in tests})
    unknown = sorted(ref for ref in tests if ref not in ci and not any(c.startswith(ref + "[") for c in ci))
    assert unknown == []
    steps = {s["id"]: s["tier"] for s in tomllib.loads((ROOT / "benchmarks" / "acceptance.toml").read_text())["step"]}
    assert sorted(ref for ref in refs - tests if steps.get(ref.removeprefix("acceptance:")) != "fast") == []
