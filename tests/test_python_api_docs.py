"""docs/python-api.md runs: its Python blocks in order, like one notebook, and its pytest
module through pytest, so the documented API cannot drift from the code. So does the
README's Python example. Each runs from a fresh temporary working directory, as a user's
notebook or test suite would: a path that only resolves from the repository root fails."""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import need

import strict_gate

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "python-api.md"
PYTEST_MODULE = re.compile(r"^# (test_\w+\.py)\n")


def blocks(doc: Path = DOC) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", doc.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_documented_names_are_the_exported_ones():
    text = DOC.read_text(encoding="utf-8")
    assert all(f"`{name}" in text for name in strict_gate.__all__), "every export is documented"
    for name in strict_gate.__all__:
        assert getattr(strict_gate, name) is not None


def test_the_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = blocks(REPO / "README.md")
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_the_examples_run(tmp_path, monkeypatch):
    need("transformers")  # run_gate, rediagnose and capture_baseline run the hf engine
    (work := tmp_path / "work").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' mkdtemp() land here
    notebook = [b for b in blocks() if not PYTEST_MODULE.match(b)]
    assert len(notebook) >= 5
    namespace: dict = {"__name__": "python_api_doc"}
    for i, code in enumerate(notebook):
        exec(compile(code, f"{DOC}:block{i}", "exec"), namespace)


def test_the_pytest_example_passes(tmp_path):
    need("transformers")
    (module,) = [b for b in blocks() if PYTEST_MODULE.match(b)]
    path = tmp_path / PYTEST_MODULE.match(module).group(1)
    path.write_text(module, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
