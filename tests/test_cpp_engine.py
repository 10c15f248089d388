"""The C++ example engine (examples/engines/cpp/) as a real candidate over the command protocol.

The binary is built by scripts/build-cpp-engine.sh with the system g++ (build/cpp/engine), once
per module. Without g++ these tests skip, except under CI (CI set), where they fail: .ci/run
installs the compiler, so a skipped C++ test there would be a gate that proved nothing. Every
test runs the real binary on the bundled tiny-llama; nothing is mocked. The shipped gates are
run as a user runs them (`strict-gate gate gates/cpp-f32*.toml`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest
from conftest import need
from helpers import section, smollm2_converted
from hypothesis import given, settings
from hypothesis import strategies as st

from strict_gate.engines import PromptInput
from strict_gate.engines.command.engine import CommandEngine, CommandOptions
from strict_gate.engines.command.replies import generate_record
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Sampling

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "cpp" / "engine"
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
BASELINE = ROOT / "baselines" / "tiny-llama-vllm-fp32"
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
VOCAB = 1024


def _baseline_prompts() -> dict[str, list[int]]:
    lines = (BASELINE / "records.jsonl").read_text().splitlines()
    return {r["id"]: r["prompt_token_ids"] for r in map(json.loads, lines) if r}


PROMPTS = _baseline_prompts()
SOME = ["prose-001", "code-006", *sorted(PROMPTS)[40:44]]  # code-006: vLLM stops on </s> after one token


class Session:
    """The binary on stdin/stdout, as the gate drives it, one request line at a time."""

    def __init__(self, binary: Path, tmp: Path, *args: str, model: Path = MODEL):
        self.stderr = tmp / f"stderr-{len(list(tmp.glob('stderr-*')))}.log"
        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen([str(binary), "--model", str(model), *args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[str] = self.proc.stdin
        self.stdout: IO[str] = self.proc.stdout
        self.hello = json.loads(self.stdout.readline())

    def send(self, line: str) -> None:
        self.stdin.write(line + "\n")
        self.stdin.flush()

    def ask(self, req: dict | str) -> dict:
        self.send(req if isinstance(req, str) else json.dumps(req))
        return json.loads(self.stdout.readline())

    def generate(self, pid: str, max_tokens: int = 16, k: int = 5, **extra) -> dict:
        return self.ask({"op": "generate", "id": pid, "prompt_token_ids": PROMPTS[pid],
                         "max_tokens": max_tokens, "top_logprobs": k, **extra})

    def score(self, pid: str, cont: list[int], k: int = 5) -> dict:
        return self.ask({"op": "score", "id": f"s-{pid}", "prompt_token_ids": PROMPTS[pid], "continuation_ids": cont,
                         "top_logprobs": k})

    def close(self) -> int:
        self.stdin.close()
        return self.proc.wait(timeout=30)


@pytest.fixture
def session(binary, tmp_path):
    s = Session(binary, tmp_path)
    yield s
    if s.proc.poll() is None:
        s.close()


def chosen_logprobs(reply: dict) -> list[float]:
    return [dict(map(tuple, step))[t] for t, step in zip(reply["token_ids"], reply["top_logprobs"])]


def gate(config: Path, out: Path) -> tuple[int, str, dict]:
    """Run `strict-gate gate` as a user would; (exit code, output, report.json)."""
    r = subprocess.run([sys.executable, "-m", "strict_gate.cli", "gate", str(config), "-o", str(out)], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=900)
    reports = list(out.glob("*/report.json"))
    if not reports:
        pytest.fail(f"no report (exit {r.returncode}): {(r.stdout + r.stderr)[-3000:]}")
    return r.returncode, r.stdout + r.stderr, json.loads(reports[0].read_text())


def test_hello_states_what_it_runs(session):
    h = session.hello
    assert h["hello"] == "strict-gate/engine@1" and h["name"] == "strict-gate-cpp"
    assert h["capabilities"] == ["generate", "score", "stream", "speculative", "dump", "graft", "dump_decode"]
    assert (h["dtype"], h["eager"], h["prefix_cache"], h["max_context"]) == ("float32", True, False, 512)
    s = h["settings"]
    assert (s["prefill"], s["tied_head"], s["model_eos_token_ids"], s["kv_bug"]) == ("batched", True, [2], "none")


@pytest.mark.parametrize("name", ["cpp-f32", "cpp-f32-stepwise"])
def test_shipped_gate_passes_strict_against_vllm(binary, tmp_path, name):
    """Both prefill settings against vLLM's committed fp32 golden: 128/128 on this model (its
    smallest top-2 margin is far above the few 1e-5 nats the summation order moves)."""
    code, out, report = gate(ROOT / "gates" / f"{name}.toml", tmp_path)
    assert code == 0, out[-3000:]
    assert report["verdict"] == "pass" and report["summary"]["prompts_exact"] == 128, report["summary"]
    (d,) = [p.parent for p in tmp_path.glob("*/report.json")]
    run = load_run(d / "candidate")
    assert run.complete and len(run.records) == 128
    assert run.records["code-006"].finish_reason == "stop"  # vLLM stops on </s> there: so must the engine
    prefill = "stepwise" if name.endswith("stepwise") else "batched"
    assert run.manifest.engine.options["hello"]["settings"]["prefill"] == prefill


@pytest.mark.slow
def test_a_few_prompts_against_transformers_with_drift(binary, tmp_path):
    """A gate on the smoke prompts against transformers fp32, drift on: the gate sends the
    candidate a score request per prompt, so the score op is checked too."""
    need("transformers")
    cfg = tmp_path / "cpp-vs-hf.toml"
    cfg.write_text(
        f'name = "cpp-vs-hf"\nprompts = "{ROOT / "prompts" / "smoke.jsonl"}"\nmax_tokens = 8\npolicy = "strict"\n'
        f'drift = true\noutput_dir = "{tmp_path}"\n'
        '[reference]\nkind = "hf"\nmodel = "bundled:tiny-llama"\ndtype = "float32"\nthreads = 1\n'
        f'[candidate]\nkind = "command"\ncommand = ["{binary}", "--model", "{MODEL}"]\ntokenizer = "{MODEL}"\n'
    )
    code, out, report = gate(cfg, tmp_path / "r")
    assert code == 0, out[-3000:]
    assert report["summary"]["prompts_exact"] == 8
    drift = section(report, "drift")
    assert drift["prompts_scored"] == 8 and drift["same_top1_rate"] == 1.0
    assert 0 < drift["abs_dlogprob"]["max"] < 1e-4  # another summation order than torch's: float noise only


def test_prefill_switch_changes_only_the_summation_order(binary, tmp_path):
    """Batched and stepwise prefill give the same tokens here but not the same bits: the switch
    really sums in another order, and the difference stays float noise."""
    replies = {}
    for mode in ("batched", "stepwise"):
        s = Session(binary, tmp_path, "--prefill", mode)
        assert s.hello["settings"]["prefill"] == mode
        replies[mode] = [s.generate(pid) for pid in SOME]
        assert s.close() == 0
    deltas = []
    for a, b in zip(replies["batched"], replies["stepwise"]):
        assert a["token_ids"] == b["token_ids"]
        deltas += [abs(x - y) for x, y in zip(chosen_logprobs(a), chosen_logprobs(b))]
    first = [abs(chosen_logprobs(a)[0] - chosen_logprobs(b)[0]) for a, b in zip(*replies.values())]
    assert sum(d > 0 for d in first) >= len(SOME) - 1, first  # the prompt's own pass differs
    assert 0 < max(deltas) < 1e-4


@pytest.mark.parametrize("mode", ["batched", "stepwise"])
def test_score_against_generate_is_the_prefill_decode_consistency(binary, tmp_path, mode):
    """Score (the prompt path) of the engine's own greedy continuation against the logprobs its
    generate reported (decode path after the first token): bit for bit equal under stepwise
    prefill, different in the last bits under batched, except at the first position, which both
    requests compute with the same prompt pass."""
    s = Session(binary, tmp_path, "--prefill", mode)
    worst, later = 0.0, []
    for pid in SOME:
        g = s.generate(pid)
        sc = s.score(pid, g["token_ids"])
        assert [st["token_id"] for st in sc["steps"]] == g["token_ids"]
        assert [st["top"][0][0] for st in sc["steps"]] == g["token_ids"]  # its own tokens are its argmax
        d = [abs(st["logprob"] - lp) for st, lp in zip(sc["steps"], chosen_logprobs(g))]
        assert d[0] == 0.0
        later += d[1:]
        worst = max(worst, *d)
    assert s.close() == 0
    if mode == "stepwise":
        assert worst == 0.0
    else:
        assert any(x > 0 for x in later) and worst < 1e-4


def test_eos_from_the_request_else_from_the_model_files_and_ignore_eos(session):
    free = session.generate("prose-001", max_tokens=6, k=2, eos_token_ids=[2])
    assert len(free["token_ids"]) == 6 and free["finish_reason"] == "length"
    stop = free["token_ids"][2]
    cut = session.generate("prose-001", max_tokens=6, k=2, eos_token_ids=[stop])
    assert cut["token_ids"] == free["token_ids"][: free["token_ids"].index(stop) + 1]
    assert cut["finish_reason"] == "stop"
    assert session.generate("prose-001", max_tokens=6, k=2, eos_token_ids=[stop], ignore_eos=True)["token_ids"] == (
        free["token_ids"])
    # code-006 ends on </s> (id 2) at once: without eos_token_ids the model's own set (generation_config.json
    # and the tokenizer's eos token) stops it; an empty list or ignore_eos does not
    assert session.generate("code-006", k=2)["token_ids"] == [2]
    assert session.generate("code-006", k=2)["finish_reason"] == "stop"
    extras: list[dict[str, object]] = [{"eos_token_ids": []}, {"ignore_eos": True}]
    for extra in extras:
        r = session.generate("code-006", k=2, **extra)
        assert len(r["token_ids"]) == 16 and r["finish_reason"] == "length" and r["token_ids"][0] == 2


def test_stream_events_through_the_gates_command_side(binary, tmp_path):
    """The speed arm's token events, read by the gate's own CommandEngine, one per token."""
    eng = CommandEngine(CommandOptions(command=[str(binary), "--model", str(MODEL)]), base_dir=ROOT)
    eng.log_path = tmp_path / "engine.log"
    seen: list[int] = []
    try:
        eng.start()
        assert eng.streams
        rec = eng.stream_one(PromptInput("code-006", tuple(PROMPTS["code-006"])),
                             Sampling(max_tokens=5, top_logprobs=2, ignore_eos=True), seen.append)
    finally:
        eng.close()
    assert rec.error is None and len(rec.token_ids) == 5 and seen == [1] * 5


def test_stream_events_carry_the_id_and_come_before_the_reply(session):
    session.send(json.dumps({"op": "generate", "id": "p", "prompt_token_ids": PROMPTS["prose-001"], "max_tokens": 4,
                             "top_logprobs": 1, "stream": True}))
    lines = [json.loads(session.stdout.readline()) for _ in range(5)]
    assert [e["event"] for e in lines[:4]] == ["token"] * 4 and all(e["id"] == "p" for e in lines[:4])
    assert [e["token_id"] for e in lines[:4]] == lines[4]["token_ids"]


def test_error_replies_keep_the_engine_serving(session):
    good = session.generate("prose-001", max_tokens=3)
    bad = {
        "garbage": "malformed request line",
        "[1, 2]": "unsupported op",
        json.dumps({"op": "dance", "id": 7}): "unsupported op",
        json.dumps({"op": "generate", "id": "v", "prompt_token_ids": [1, VOCAB], "max_tokens": 2}):
            "vocabulary size 1024",
        json.dumps({"op": "generate", "id": "m", "prompt_token_ids": [1], "max_tokens": 0}): "max_tokens",
        json.dumps({"op": "generate", "id": "e", "prompt_token_ids": [], "max_tokens": 2}): "empty",
        json.dumps({"op": "generate", "id": "l", "prompt_token_ids": [1] * 600, "max_tokens": 2}):
            "max_position_embeddings 512",
        json.dumps({"op": "generate", "id": "b", "prompt_token_ids": [1], "max_tokens": 2, "stream": "yes"}):
            "true or false",
        json.dumps({"op": "score", "id": "c", "prompt_token_ids": [1], "continuation_ids": [1.5]}): "not a token id",
    }
    for line, why in bad.items():
        r = session.ask(line)
        assert set(r) == {"id", "error"} and why in r["error"], (line, r)
        sent = json.loads(line) if line.startswith("{") else None
        assert r["id"] == (sent.get("id") if isinstance(sent, dict) else None)
    assert session.ask({"op": "score", "id": "z", "prompt_token_ids": [1], "continuation_ids": []}) == {
        "id": "z", "steps": []}
    again = session.generate("prose-001", max_tokens=3)
    assert again["token_ids"] == good["token_ids"] and again["top_logprobs"] == good["top_logprobs"]
    assert session.close() == 0


def test_an_error_reply_is_the_prompts_error_in_the_gate(binary, tmp_path):
    """Through the gate's command side: a prompt the engine refuses (an id past its vocabulary; a
    too-long prompt the gate now refuses itself, from the hello's max_context) is recorded as an
    error, and the engine goes on with the next prompt."""
    eng = CommandEngine(CommandOptions(command=[str(binary), "--model", str(MODEL)]), base_dir=ROOT)
    eng.log_path = tmp_path / "engine.log"
    prompts = [PromptInput("bad-id", (1, 10**6)), PromptInput("prose-001", tuple(PROMPTS["prose-001"]))]
    try:
        recs = list(eng.generate(prompts, Sampling(max_tokens=4, top_logprobs=5)))
    finally:
        eng.close()
    assert recs[0].error is not None and "not a token id below the vocabulary size" in recs[0].error
    assert recs[1].error is None and len(recs[1].token_ids) == 4


@pytest.mark.parametrize("ending", ["shutdown", "eof", "torn-line", "broken-stdout"])
def test_exits_0_quietly_when_the_gate_is_done_or_gone(session, ending):
    """shutdown, stdin closed, stdin closed inside a line (the gate died while writing), and a
    stdout nobody reads any more (EPIPE: SIGPIPE would kill it with -13): exit 0, no stderr."""
    p = session.proc
    if ending == "shutdown":
        session.send('{"op": "shutdown"}')
    elif ending == "torn-line":
        session.stdin.write('{"op": "generate", "id": "a", "prompt_token_ids": [1, 2')
    elif ending == "broken-stdout":
        session.stdout.close()
        session.send(json.dumps({"op": "generate", "id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 2}))
    session.stdin.close()
    assert p.wait(timeout=30) == 0
    if ending != "broken-stdout":
        assert session.stdout.read() == ""
    assert session.stderr.read_text() == ""


@pytest.mark.parametrize("break_it,why", [
    (lambda d: (d / "config.json").write_text((d / "config.json").read_text().replace('"default"', '"linear"')),
     "rope scaling is not supported"),
    (lambda d: (d / "config.json").write_text((d / "config.json").read_text().replace('"llama"', '"mistral"')),
     "model_type other than llama"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100_000]),
     "model.safetensors"),
    (lambda d: (d / "config.json").write_text("{"), "config.json: not JSON"),
    (lambda d: (d / "config.json").unlink(), "config.json: cannot open"),
], ids=["rope-scaling", "model-type", "truncated-weights", "bad-json", "no-config"])
def test_refuses_a_model_it_cannot_run_before_its_hello(binary, tmp_path, break_it, why):
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    break_it(model)
    r = subprocess.run([str(binary), "--model", str(model)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and why in r.stderr, r.stderr


def test_refuses_bad_arguments(binary):
    for argv in ([], ["--model", str(MODEL), "--prefill", "chunked"], ["--model", str(MODEL), "--threads", "2"]):
        r = subprocess.run([str(binary), *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == "" and "usage:" in r.stderr


@pytest.fixture(scope="module")
def shared(binary, tmp_path_factory):
    s = Session(binary, tmp_path_factory.mktemp("cpp"))
    yield s
    s.close()


@settings(max_examples=150, deadline=None)
@given(rid=st.one_of(st.text(max_size=30), st.integers(-(2**62), 2**62), st.none()), ascii_only=st.booleans())
def test_any_json_id_comes_back_unchanged(shared, rid, ascii_only):
    """The JSON reader and writer round-trip an id: escapes, astral characters (surrogate pairs
    when the gate writes ASCII), raw UTF-8, big integers."""
    r = shared.ask(json.dumps({"op": "nothing", "id": rid}, ensure_ascii=ascii_only))
    assert r["id"] == rid and "unsupported op" in r["error"]


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40), max_tokens=st.integers(1, 4),
       k=st.integers(0, 7))
def test_every_reply_passes_the_gates_checks_and_is_greedy(shared, ids, max_tokens, k):
    """On any prompt: the gate's own reply check accepts it; each step's first pair is the chosen
    token, pairs sorted by logprob (ties by id), all <= 0, and the probabilities of the top k sum to
    at most 1."""
    r = shared.ask({"op": "generate", "id": "h", "prompt_token_ids": ids, "max_tokens": max_tokens,
                    "top_logprobs": k, "eos_token_ids": [2]})
    rec = generate_record(r, ids, Sampling(max_tokens=max_tokens, top_logprobs=k), "h", (2,))
    assert rec.error is None and 1 <= len(rec.token_ids) <= max_tokens
    if k == 0:
        assert "top_logprobs" not in r
        return
    for tok, step in zip(r["token_ids"], r["top_logprobs"]):
        assert len(step) == k and step[0][0] == tok
        assert step == sorted(step, key=lambda p: (-p[1], p[0]))
        assert all(lp <= 0 for _, lp in step) and sum(math.exp(lp) for _, lp in step) <= 1 + 1e-9


@pytest.mark.slow
def test_the_real_model_gqa_tied_head_full_vocabulary_equals_transformers(binary, tmp_path):
    """SmolLM2-135M (30 layers, 9 heads over 3 KV heads, tied embeddings, 49,152 ids) through
    the engine, greedy, against transformers float32 on the same files: the same tokens, the
    logprobs within 1e-3 nats; speculating, the very same reply."""
    need("torch")
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = smollm2_converted()
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    prompts = [tok.encode(t).ids for t in ("The capital of France is", "def fibonacci(n):\n    ")]
    s = Session(binary, tmp_path, model=model)
    assert (s.hello["settings"]["tied_head"], s.hello["max_context"]) == (True, 8192)
    replies = [s.ask({"op": "generate", "id": f"r{i}", "prompt_token_ids": ids, "max_tokens": 8, "top_logprobs": 2,
                      "ignore_eos": True}) for i, ids in enumerate(prompts)]
    fast = [s.ask({"op": "generate", "id": f"r{i}", "prompt_token_ids": ids, "max_tokens": 8, "top_logprobs": 2,
                   "ignore_eos": True, "speculative": {"method": "ngram", "num_speculative_tokens": 3}})
            for i, ids in enumerate(prompts)]
    assert s.close() == 0
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for ids, r, f in zip(prompts, replies, fast):
        assert {k: v for k, v in f.items() if k not in ("timing", "speculative")} == \
            {k: v for k, v in r.items() if k != "timing"}
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, pad_token_id=2, eos_token_id=None)
        assert out.sequences[0, len(ids):].tolist() == r["token_ids"]
        chosen = chosen_logprobs(r)
        refs = [torch.log_softmax(step[0].double(), -1)[t].item() for step, t in zip(out.logits, r["token_ids"])]
        assert max(abs(a - b) for a, b in zip(chosen, refs)) < 1e-3, (chosen, refs)
