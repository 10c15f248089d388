"""The slow tier's list (tests/tiers.py) names tests that exist, each with why CI may leave it out."""

import subprocess
import sys
from pathlib import Path

from tiers import FULL

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_in_the_slow_tier_exists_and_says_why():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "full",
                          *sorted({k.split("::")[0] for k in FULL})],
                         cwd=ROOT, capture_output=True, text=True, check=False).stdout
    collected = {line.strip() for line in out.splitlines() if "::" in line}
    assert sorted(set(FULL) - collected) == []
    assert all(why.strip() for why in FULL.values())
