"""The library surface: `import strict_gate` stays light, the exports resolve lazily, and
rediagnose (the `diagnose` command) refuses what it cannot do with a usable error."""

import importlib
import subprocess
import sys

import pytest
from test_gate_offline import battery, gate_toml, runs
from typer.testing import CliRunner

import strict_gate
from strict_gate.cli import app

HEAVY = ("torch", "transformers", "vllm")


def _modules_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(sorted(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return eval(out.strip().splitlines()[-1])


def test_import_loads_no_submodule_and_the_entry_points_no_engine():
    assert not [m for m in _modules_after("import strict_gate") if m.startswith("strict_gate.")]
    loaded = _modules_after("import strict_gate as s\nfor n in s.__all__: getattr(s, n)")
    assert not [m for m in loaded if m.split(".")[0] in HEAVY]
    assert "strict_gate.gate.rescore" in loaded


def test_exports():
    assert set(strict_gate.__all__) <= set(dir(strict_gate))
    assert isinstance(strict_gate.__version__, str) and strict_gate.__version__
    importlib.import_module("strict_gate.gate.rescore")  # binds the submodule on the package; the export must win
    assert callable(strict_gate.rediagnose) and strict_gate.rediagnose.__name__ == "rediagnose"
    assert issubclass(strict_gate.ConfigError, strict_gate.StrictGateError)
    with pytest.raises(AttributeError):
        strict_gate.no_such_name  # noqa: B018


def test_rediagnose_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(strict_gate.InputError, match="gate.toml is missing"):
        strict_gate.rediagnose(tmp_path)
    prompts, ps = battery(tmp_path)
    runs(tmp_path, ps.sha256)
    outcome = strict_gate.run_gate(strict_gate.load_gate_config(gate_toml(tmp_path, prompts)))
    assert outcome.result.verdict.verdict == "fail"  # a near-tie under strict: something to re-score
    # both arms are stored runs and there is no [rescorer]: nothing can score
    with pytest.raises(strict_gate.ConfigError, match=r"add a \[rescorer\]") as e:
        strict_gate.rediagnose(outcome.report_dir)
    assert e.value.exit_code == 2
    r = CliRunner().invoke(app, ["diagnose", str(outcome.report_dir)])
    assert r.exit_code == 2 and "[rescorer]" in r.output and "Traceback" not in r.output
    (outcome.report_dir / "report.json").write_text("{not json")
    with pytest.raises(strict_gate.InputError, match="cannot read the report"):
        strict_gate.rediagnose(outcome.report_dir)
