"""Runs one arm over a prompt set into a run directory, and summarises oracle determinism.

The runner owns everything engines should not: env scoping, run files written as they
go, wall-clock timing, repeated capture runs, and turning an engine failure into a
failed (never complete-looking) run that keeps the prompts already done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from strict_gate.audit import audit_record, vocab_size
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import EngineError, StrictGateError
from strict_gate.prompts import PromptSet
from strict_gate.reader import load_run
from strict_gate.records import Manifest, Record, Run, RunWriter, Sampling, Timing, now_iso

OnRecord = Callable[[Record, float], None]  # (record, seconds it took)


def prompt_inputs(prompts: PromptSet, tokenizer_engine: Engine) -> list[PromptInput]:
    """Tokenize once, with one engine, so both arms are fed the very same ids."""
    with tokenizer_engine.scoped_env():
        return [
            PromptInput(id=p.id, token_ids=tokenizer_engine.prompt_token_ids(p), text=p.text)
            for p in prompts.prompts
        ]


def determinism_summary(records: Sequence[Record]) -> dict:
    """Across the K captured runs: how many prompts repeat exactly, and where the others split."""
    per_prompt = []
    k = 0
    for rec in records:
        samples = rec.samples or ()
        k = max(k, len(samples))
        if len(samples) < 2 or all(s == samples[0] for s in samples[1:]):
            continue
        width = max(len(s) for s in samples)
        positions = []
        for i in range(width):
            seen = sorted({s[i] if i < len(s) else -1 for s in samples})
            if len(seen) > 1:
                positions.append({"position": i, "tokens": [t for t in seen if t >= 0], "ended": -1 in seen})
        distinct = len({tuple(s) for s in samples})
        per_prompt.append({"id": rec.id, "distinct_sequences": distinct, "positions": positions})
    total = len(records)
    return {
        "runs": k,
        "prompts_total": total,
        "prompts_deterministic": total - len(per_prompt),
        "non_deterministic": per_prompt,
    }


def _timed(rec: Record, seconds: float) -> Record:
    """Fill in the wall clock the gate measured when the engine reported none."""
    if rec.timing is not None and rec.timing.total_s is not None:
        return rec
    return replace(rec, timing=Timing(ttft_s=rec.timing.ttft_s if rec.timing else None, total_s=seconds))


def _generate(engine: Engine, inputs: Sequence[PromptInput], sampling: Sampling, runs: int):
    """Yield (record, seconds) per prompt. One run: the engine gets every prompt and batches as
    its own `batch` option says. K runs: one prompt per call, K calls in a row, samples kept."""
    if runs == 1:
        t0 = time.perf_counter()
        for rec in engine.generate(inputs, sampling):
            dt, t0 = time.perf_counter() - t0, time.perf_counter()
            yield (rec if rec.error else _timed(rec, dt)), dt
        return
    for p in inputs:
        samples: list[tuple[int, ...]] = []
        first: Record | None = None
        for _ in range(runs):
            t0 = time.perf_counter()
            recs = list(engine.generate([p], sampling))
            dt = time.perf_counter() - t0
            if not recs:
                break  # a recorded run without this prompt: it stays missing
            rec = recs[0]
            if rec.error is not None:
                first = rec
                break
            samples.append(rec.token_ids)
            if first is None:
                first = _timed(rec, dt)
        if first is None:
            continue
        seconds = first.timing.total_s if first.timing and first.timing.total_s else 0.0
        yield (first if first.error else replace(first, samples=tuple(samples))), seconds


def run_arm(
    engine: Engine,
    inputs: Sequence[PromptInput],
    sampling: Sampling,
    out_dir: str | Path,
    *,
    prompt_set: PromptSet,
    runs: int = 1,
    on_record: OnRecord | None = None,
) -> Run:
    """Generate every prompt (K times when runs > 1) and write the run directory.

    On an engine failure the run is closed as failed with the prompt it died on and the
    records done so far, and the EngineError propagates (exit 3).
    """
    out = Path(out_dir)
    if engine.writes_log:
        out.mkdir(parents=True, exist_ok=True)
        engine.set_log_path(out / "engine.log")
    manifest = Manifest(
        engine=engine.info(),
        prompt_set={
            "name": prompt_set.name, "sha256": prompt_set.sha256, "count": len(prompt_set), "ids": prompt_set.ids,
        },
        sampling=sampling,
        created=now_iso(),
        runs=runs,
    )
    writer = RunWriter(out, manifest)
    pending = [p.id for p in inputs]  # pending[0] is the prompt in flight when an engine dies
    current = pending[0] if pending else None
    try:
        with engine.scoped_env():
            engine.start()
            # Describe the engine again once started: versions and server facts are known now.
            writer.manifest = replace(writer.manifest, engine=engine.info())
            vocab = vocab_size(writer.manifest.engine)
            for rec, seconds in _generate(engine, inputs, sampling, runs):
                problem = None if rec.error is not None else audit_record(rec, sampling.max_tokens, vocab)
                if problem is not None:  # the engine broke the run format: an engine failure
                    raise EngineError(f"{engine.kind} engine broke the run format on prompt {rec.id!r}: {problem}")
                if rec.id in pending:
                    pending.remove(rec.id)
                current = pending[0] if pending else None
                writer.add(rec)
                if on_record is not None:
                    on_record(rec, seconds)
    except StrictGateError as e:
        writer.fail(str(e), failed_prompt=current)
        if isinstance(e, EngineError) and current and current not in str(e):
            raise EngineError(f"{e} (while on prompt {current!r})") from None
        raise
    except KeyboardInterrupt:
        writer.fail("interrupted (Ctrl-C)", failed_prompt=current)
        raise
    except Exception as e:  # an engine bug: keep what was done, say where it died
        writer.fail(f"{type(e).__name__}: {e}", failed_prompt=current)
        raise EngineError(f"{engine.kind} engine failed on prompt {current!r}: {type(e).__name__}: {e}") from e
    extra = {}
    if runs > 1:
        done = load_run(out, allow_incomplete=True)
        extra["determinism"] = determinism_summary(list(done.records.values()))
    writer.finish(**extra)
    return load_run(out)
