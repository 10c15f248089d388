"""In-process engines' logs go to the arm's engine.log, not the console (`-v` keeps them there)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need
from helpers import write_gate

from strict_gate.core.engine_log import engine_log, engine_logs_on_console

REPO = Path(__file__).resolve().parent.parent


def test_loggers_descriptors_and_children_go_to_the_file_and_are_restored(tmp_path, capfd):
    logger = logging.getLogger("sg-test-lib")
    before = logging.StreamHandler(sys.stderr)
    logger.addHandler(before)
    log = tmp_path / "run" / "engine.log"
    with engine_log(log, ("sg-test-lib",)):
        logger.warning("from the library logger")
        os.write(1, b"from C code on fd 1\n")
        os.write(2, b"from C code on fd 2\n")
        subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
    logger.warning("after the arm")
    out, err = capfd.readouterr()
    text = log.read_text()
    for line in ("from the library logger", "from C code on fd 1", "from C code on fd 2", "from a child process"):
        assert line in text and line not in out + err
    assert "after the arm" in err and "after the arm" not in text
    assert logger.handlers == [before] and logger.propagate
    logger.removeHandler(before)


def test_on_console_writes_nothing_and_no_libraries_is_a_no_op(tmp_path, capfd):
    with engine_logs_on_console(), engine_log(tmp_path / "a.log", ("sg-test-lib",)):
        os.write(2, b"shown\n")
    with engine_log(tmp_path / "b.log", ()):
        os.write(2, b"also shown\n")
    assert capfd.readouterr().err == "shown\nalso shown\n"
    assert not (tmp_path / "a.log").exists() and not (tmp_path / "b.log").exists()


@pytest.mark.slow
def test_a_real_hf_gate_keeps_transformers_logs_off_the_console(tmp_path):
    """transformers at INFO logs its config on every load: all of it lands in the run dirs."""
    need("transformers")
    hf = {"kind": "hf", "model": "bundled:tiny-llama"}
    g = write_gate(tmp_path, file="g.toml", name="quiet", prompts=REPO / "prompts" / "smoke.jsonl", max_tokens=4,
                   policy="strict", output_dir=tmp_path / "reports", reference=hf, candidate=hf)
    env = os.environ | {"TRANSFORMERS_VERBOSITY": "info", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", str(g)], capture_output=True,
                          text=True, env=env, timeout=300)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    assert "PASS" in proc.stdout and "8/8" in proc.stdout
    assert "loading configuration file" not in console and "LlamaConfig" not in console
    (d,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    for arm in ("reference", "candidate"):
        log = (d / arm / "engine.log").read_text()
        assert "loading configuration file" in log and "LlamaConfig" in log, arm
