"""`pip install strict-gate` with no extras serves prompts, compare, diff and every report.

A fresh venv gets the package (not editable, from a copy of the source) and its core
dependencies from the registry; torch, transformers and vLLM must not be there, and the
commands that promise no torch must work without them.
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BASELINES = REPO / "baselines"
HEAVY = ("torch", "transformers", "vllm")

pytestmark = pytest.mark.install


def _env() -> dict[str, str]:
    """The environment without PYTHONPATH, so the venv sees only what pip put in it."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(*cmd, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _ok(proc: subprocess.CompletedProcess, code: int = 0) -> str:
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """A venv holding strict-gate without extras; returns its bin directory.

    The wheel is built from a copy of the source (a build in the worktree would leave
    build/ and *.egg-info there); this interpreter's pip installs it and the core
    dependencies, from the registry, into a venv made without pip (ensurepip and
    byte-compiling would double the time). Commands run outside the repository, so
    nothing is imported from the source tree by accident."""
    root = tmp_path_factory.mktemp("bare")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "strict_gate", src / "strict_gate", ignore=shutil.ignore_patterns("__pycache__"))
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    _ok(_run(*pip, "wheel", "-q", "--no-deps", "-w", root / "dist", src, cwd=root))
    (wheel,) = (root / "dist").glob("strict_gate-*.whl")
    _ok(_run(sys.executable, "-m", "venv", "--without-pip", root / "venv", cwd=root))
    bin_dir = root / "venv" / "bin"
    _ok(_run(*pip, "--python", bin_dir / "python", "install", "-q", "--no-compile", wheel, cwd=root, timeout=600))
    return bin_dir


def test_no_heavy_packages_and_the_installed_copy_is_used(bare, tmp_path):
    out = _ok(_run(bare / "python", "-c",
                   "import importlib.util as u, strict_gate; "
                   f"print([m for m in {HEAVY!r} if u.find_spec(m)]); print(strict_gate.__file__)", cwd=tmp_path))
    found, location = out.splitlines()
    assert found == "[]", f"a bare install must not pull in {found}"
    assert location.startswith(str(bare.parent)), location


def test_prompts_and_help(bare, tmp_path):
    out = _ok(_run(bare / "strict-gate", "prompts", REPO / "prompts/smoke.jsonl", cwd=tmp_path))
    assert "8 prompts" in out and "sha256" in out
    assert "compare" in _ok(_run(bare / "strict-gate", "--help", cwd=tmp_path))


def test_compare_committed_baselines_writes_every_report(bare, tmp_path):
    out = tmp_path / "out"
    proc = _run(bare / "strict-gate", "compare", BASELINES / "tiny-llama-vllm-fp32", BASELINES / "tiny-llama-vllm-bf16",
                "--prompts", REPO / "prompts/battery-128.jsonl", "--out", out, cwd=tmp_path)
    _ok(proc, 1)  # float32 and bfloat16 vLLM differ: an honest fail
    assert "FAIL" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail" and report["summary"]["prompts_total"] == 128
    assert (out / "report.md").read_text().startswith("# FAIL")
    assert "FAIL" in (out / "report.html").read_text()
    assert "<failure" in (out / "junit.xml").read_text()
    # night to night: the same pair compared again (fp32 with itself) is no regression from it
    same = tmp_path / "same"
    _ok(_run(bare / "strict-gate", "compare", BASELINES / "tiny-llama-vllm-fp32", BASELINES / "tiny-llama-vllm-fp32",
             "--out", same, cwd=tmp_path), 0)
    diff = _run(bare / "strict-gate", "diff", same, out, "--json", tmp_path / "diff.json", cwd=tmp_path)
    _ok(diff, 1)  # bf16 after fp32: prompts stopped matching, a regression
    assert json.loads((tmp_path / "diff.json").read_text())["stopped_matching"]
    _ok(_run(bare / "strict-gate", "diff", out, same, "--json", tmp_path / "back.json", cwd=tmp_path), 0)


def test_python_api_without_torch(bare, tmp_path):
    fp32 = str(BASELINES / "tiny-llama-vllm-fp32")
    code = (
        "import sys, strict_gate\n"
        f"r = strict_gate.compare_run_dirs({fp32!r}, {fp32!r})\n"
        "assert r.verdict.verdict == 'pass' and r.exit_code == 0, r.verdict\n"
        f"assert not [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(strict_gate.__version__)\n"
    )
    version = _ok(_run(bare / "python", "-c", code, cwd=tmp_path)).strip()
    assert version == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
