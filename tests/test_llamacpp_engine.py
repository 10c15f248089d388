"""llama.cpp (llama-cpp-python) as a real candidate over the command protocol.

examples/engines/llamacpp_engine.py runs under .venvs/llamacpp on the GGUF files of
build/gguf/, both made by scripts/install-llamacpp.sh. Without them these tests skip, except
under CI (CI set), where they fail: .ci/run installs the engine, so a skipped llama.cpp test
there would be a gate that proved nothing. The shipped gates are run as a user runs them
(`strict-gate gate gates/llamacpp-*.toml`), against vLLM's committed fp32 golden.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import child_pid

from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.runs.reader import load_run

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venvs" / "llamacpp" / "bin" / "python"
ADAPTER = ROOT / "examples" / "engines" / "llamacpp_engine.py"
GGUF = {t: ROOT / "build" / "gguf" / f"tiny-llama-{t}.gguf" for t in ("f32", "f16", "q8_0")}
BATTERY = ROOT / "prompts" / "battery-128.jsonl"
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def need_llamacpp() -> None:
    """Fail under CI, skip elsewhere, when the llama.cpp venv or the GGUF files are missing."""
    missing = [str(p.relative_to(ROOT)) for p in (VENV_PY, *GGUF.values()) if not p.exists()]
    if not missing:
        return
    why = f"llama.cpp engine not installed ({', '.join(missing)} missing); run: bash scripts/install-llamacpp.sh"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but the {why}", pytrace=False)
    pytest.skip(why)


def gate(config: Path, out: Path, *extra: str) -> tuple[int, str, dict | None]:
    """Run `strict-gate gate` as a user would; (exit code, output, report.json or None)."""
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", str(config), "-o", str(out), *extra],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    reports = list(out.glob("*/report.json"))
    return r.returncode, r.stdout + r.stderr, json.loads(reports[0].read_text()) if reports else None


def statuses(report: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in report["prompts"]:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    return counts


def test_a_venv_python_in_the_command_is_not_resolved_out_of_its_venv(tmp_path):
    """`bin/python` of a venv is a symlink to the base interpreter; following it loses the venv."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    eng = CommandEngine(CommandOptions(command=["venv/bin/python", "x.py"]), base_dir=tmp_path)
    assert eng.argv[0] == str(tmp_path.absolute() / "venv" / "bin" / "python")


def test_llamacpp_tokenizer_matches_the_hf_tokenizer():
    """The converter's pre-tokenizer mapping ('gpt-2' for the bundled ByteLevel tokenizer) is right:
    llama.cpp tokenizes the whole battery as the tokenizer.json the gate uses does."""
    need_llamacpp()
    from tokenizers import Tokenizer

    texts = [json.loads(line)["text"] for line in BATTERY.read_text().splitlines() if line.strip()]
    script = (
        "import json, sys, ctypes, llama_cpp as L\n"
        "p = L.llama_model_default_params(); p.vocab_only = True\n"
        "m = L.llama_model_load_from_file(sys.argv[1].encode(), p); v = L.llama_model_get_vocab(m)\n"
        "out = []\n"
        "for t in json.load(sys.stdin):\n"
        "    b = t.encode(); buf = (L.llama_token * (len(b) + 8))()\n"
        "    n = L.llama_tokenize(v, b, len(b), buf, len(buf), True, False); out.append(list(buf[:n]))\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run([str(VENV_PY), "-c", script, str(GGUF["f32"])], input=json.dumps(texts),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    tok = Tokenizer.from_file(str(ROOT / "strict_gate" / "models" / "tiny-llama" / "tokenizer.json"))
    want = [e.ids for e in tok.encode_batch(texts)]
    assert len(got) == len(want) == 128
    assert [i for i, (g, w) in enumerate(zip(got, want)) if g != w] == []


def test_engine_stops_on_the_requests_eos_and_exits_quietly_when_the_gate_goes_away():
    """The request's eos_token_ids end a sequence; stdin closed inside a line (the gate died while
    writing): exit 0, promptly, nothing more on stdout."""
    need_llamacpp()
    proc = subprocess.Popen([str(VENV_PY), str(ADAPTER), "--model", str(GGUF["f32"]), "--threads", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def ask(**req) -> dict:
        proc.stdin.write(json.dumps({"op": "generate", "id": "a", "prompt_token_ids": [1, 300, 301, 302],
                                     "max_tokens": 6, "top_logprobs": 2, **req}) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    hello = json.loads(proc.stdout.readline())
    assert hello["hello"] == "strict-gate/engine@1"
    assert hello["capabilities"] == ["generate", "score", "dump", "dump_decode"]
    s = hello["settings"]
    assert (s["kv_type"], s["flash_attn"], s["extra_bufts"], s["n_ctx"], s["eog_ids"]) == ("f32", "off", False, 512, [2])
    free = ask()
    assert len(free["token_ids"]) == 6 and free["finish_reason"] == "length"
    stop = free["token_ids"][2]
    cut = ask(eos_token_ids=[stop])
    assert cut["token_ids"] == free["token_ids"][: free["token_ids"].index(stop) + 1]
    assert cut["finish_reason"] == "stop"
    assert ask(eos_token_ids=[stop], ignore_eos=True)["token_ids"] == free["token_ids"]  # the speed arm's
    proc.stdin.write('{"op": "gener')
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert proc.stdout.read() == ""


@pytest.mark.slow
def test_f32_gate_passes_strict_against_vllm(tmp_path):
    need_llamacpp()
    t0 = time.monotonic()
    code, out, report = gate(ROOT / "gates" / "llamacpp-f32.toml", tmp_path)
    assert code == 0, out[-3000:]
    assert report["verdict"] == "pass" and statuses(report) == {"match": 128}, statuses(report)
    assert report["summary"]["prompts_exact"] == 128
    (d,) = [p.parent for p in tmp_path.glob("*/report.json")]
    run = load_run(d / "candidate")
    assert run.complete and len(run.records) == 128
    assert run.records["code-006"].finish_reason == "stop"  # vLLM stops on </s> there: so must llama.cpp
    print(f"llamacpp-f32: 128/128 exact in {time.monotonic() - t0:.1f} s")


@pytest.mark.slow
@pytest.mark.vllm
def test_q8_0_gate_fails_with_its_flips_classified(tmp_path):
    """Quantized weights flip tokens: a failing gate (exit 1, not an engine failure), every
    non-matching prompt classified, the divergent ones re-scored by vLLM."""
    need_llamacpp()
    t0 = time.monotonic()
    code, out, report = gate(ROOT / "gates" / "llamacpp-q8_0.toml", tmp_path)
    assert code == 1, out[-3000:]
    counts = statuses(report)
    assert report["verdict"] == "fail" and counts.get("match", 0) < 128
    assert set(counts) <= {"match", "near_tie", "divergent", "length_mismatch"}, counts
    assert counts.get("near_tie", 0) + counts.get("divergent", 0) > 0, counts
    flipped = [p for p in report["prompts"] if p["status"] in ("near_tie", "divergent")]
    assert all(p["first_divergence"] is not None for p in flipped)
    print(f"llamacpp-q8_0: {counts} in {time.monotonic() - t0:.1f} s")


def _engine_pid(gate_pid: int) -> int | None:
    return child_pid(gate_pid, b"llamacpp_engine.py")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGILL], ids=["SIGKILL", "SIGILL"])
def test_engine_killed_mid_run_is_exit_3_and_keeps_the_finished_prompts(tmp_path, sig):
    """The engine dies mid-run (kill -9; a SIGILL as the Q8_0 repack path gave): the gate says so,
    exit 3, the prompts finished before are kept, and `gate --resume` completes the run."""
    need_llamacpp()
    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "strict_gate.cli", "gate", str(ROOT / "gates" / "llamacpp-f32.toml"),
                             "-o", str(out)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline, pid, going = time.monotonic() + 120, None, False
    while time.monotonic() < deadline and proc.poll() is None and not going:
        pid = pid or _engine_pid(proc.pid)  # found at start-up, before the run can finish
        partial = list(out.glob("*/candidate/records.jsonl.partial"))
        going = pid is not None and bool(partial) and partial[0].read_text().count("\n") >= 3
        time.sleep(0.005)
    assert going, "the engine never got going: " + proc.communicate()[0].decode()[-2000:]
    os.kill(pid, signal.SIGSTOP)  # freeze it, so it cannot finish the run before the signal lands
    os.kill(pid, sig)
    os.kill(pid, signal.SIGCONT)
    text = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 3, text[-3000:]
    assert f"was killed by {sig.name}" in text, text[-3000:]
    (d,) = [p for p in out.iterdir() if p.is_dir()]
    kept = load_run(d / "candidate", allow_incomplete=True)
    assert kept.manifest.status == "failed" and 3 <= len(kept.records) < 128
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", "--resume", str(d)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"candidate kept {len(kept.records)}, generated {128 - len(kept.records)}" in r.stderr, r.stderr[-3000:]
