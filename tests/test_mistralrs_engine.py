"""The mistral.rs adapter (examples/engines/mistralrs_engine.py), real engine, real gates.

The engine runs under its own interpreter (.venvs/mistralrs, the `mistralrs` CPU wheel) on a
checkpoint prepared by scripts/install-mistralrs.sh. Without them these tests skip, except
under CI, where they fail: CI installs the engine (scripts/test.sh), and a gate whose engine
tests were skipped proves nothing. The shipped tiny-llama gate runs as shipped: the full
128-prompt battery against the committed vLLM float32 baseline. The real-model gates
(gates/smollm2-mistralrs-*) are the acceptance run's (benchmarks/acceptance.toml).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from strict_gate.engines.base import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.errors import EngineError
from strict_gate.gate.config import load_gate_config
from strict_gate.gate.run import run_gate
from strict_gate.runs.records import Sampling

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venvs" / "mistralrs" / "bin" / "python"
ADAPTER = ROOT / "examples" / "engines" / "mistralrs_engine.py"
MODEL = ROOT / "build" / "mistralrs" / "tiny-llama"
INSTALL = "bash scripts/install-mistralrs.sh"
PROMPT = PromptInput("p", (1, 50, 81, 317, 311, 623, 263, 898))


def need_mistralrs() -> None:
    """conftest.need() for an engine in another interpreter: fail under CI, skip elsewhere."""
    missing = [str(p.relative_to(ROOT)) for p in (PYTHON, MODEL / "config.json") if not p.exists()]
    if not missing:
        return
    why = f"the mistral.rs engine is not installed ({', '.join(missing)} missing); install with: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


need_mistralrs()


def engine(log: Path, *args: str, model: Path = MODEL, eos: list[int] | None = None) -> CommandEngine:
    argv = [str(PYTHON), str(ADAPTER), "--model", str(model), *args]
    eng = CommandEngine(CommandOptions(command=argv, log=str(log), eos_token_ids=eos), base_dir=ROOT)
    eng.start()
    return eng


def test_f32_gate_passes_against_the_vllm_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_gate_config(ROOT / "gates" / "mistralrs-f32.toml")
    t0 = time.monotonic()
    outcome = run_gate(cfg, output_dir=Path("out"))
    r = outcome.result
    assert r.verdict.verdict == "pass" and r.exit_code == 0, r.verdict.reasons
    s = r.comparison.summary
    assert (s.prompts_exact, s.prompts_total) == (128, 128)
    assert s.positions_matched == s.positions_total
    m = json.loads((outcome.report_dir / "candidate" / "manifest.json").read_text())
    hello = m["engine"]["options"]["hello"]
    assert m["engine"]["versions"]["mistralrs"] == "0.9.5" and hello["dtype"] == "float32"
    assert hello["settings"]["MISTRALRS_CPU_KV_F32"] == "1"
    print(f"f32: 128/128 exact in {time.monotonic() - t0:.1f} s")


def test_the_requests_eos_token_ids_end_the_sequence(tmp_path):
    """mistral.rs has no stop-by-id: the adapter cuts at the first of the request's EOS ids."""
    sampling = Sampling(max_tokens=12, top_logprobs=2)
    eng = engine(tmp_path / "e.log")
    (free,) = eng.generate([PROMPT], sampling)
    eng.close()
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.token_ids[3]
    eng = engine(tmp_path / "e.log", eos=[stop])
    (rec,) = eng.generate([PROMPT], sampling)
    eng.close()
    assert rec.finish_reason == "stop" and rec.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert rec.top_logprobs == free.top_logprobs[: len(rec.token_ids)]


@pytest.mark.parametrize("ids, why", [
    ((1, 5, 15), "do not survive mistral.rs's text round trip"),  # '",' is one token, 837
    ((263, 263, 263, 263), "mistral.rs saw 5 prompt tokens, the request sent 4"),  # no BOS: it adds one
])
def test_a_prompt_mistralrs_would_not_see_as_sent_is_refused(tmp_path, ids, why):
    """mistral.rs takes text, not ids: a prompt it would tokenize into other ids is an error for
    that prompt (the gate reports it, never a pass), not another prompt silently served."""
    eng = engine(tmp_path / "e.log")
    try:
        (rec,) = eng.generate([PromptInput("p", ids)], Sampling(max_tokens=2, top_logprobs=1))
    finally:
        eng.close()
    assert rec.error is not None and why in rec.error and not rec.token_ids


def test_a_config_without_rope_theta_is_refused_with_the_fix(tmp_path):
    """The trap the issue met: mistral.rs cannot load transformers 5's config.json."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for f in MODEL.iterdir():
        (raw / f.name).symlink_to(f.resolve())
    (raw / "config.json").unlink()
    cfg = json.loads((MODEL / "config.json").read_text())
    del cfg["rope_theta"]
    (raw / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineError, match="scripts/convert_mistralrs.py"):
        engine(tmp_path / "e.log", model=raw)
