"""Runs one arm over a prompt set into a run directory, and summarises oracle determinism.

The runner owns everything engines should not: env scoping, run files written as they
go, wall-clock timing, repeated capture runs, and turning an engine failure into a
failed (never complete-looking) run that keeps the prompts already done, and continuing
such a run where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from strict_gate.core.engine_log import engine_log
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError, EngineError, IncompleteRunError, InputError, StrictGateError, located
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE, audit_record, greedy_violation, vocab_size
from strict_gate.runs.determinism import determinism_summary
from strict_gate.runs.layout import RunDir
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import EngineInfo, Manifest, Record, Run, Sampling, Timing, now_iso
from strict_gate.runs.writer import RunWriter

# (record, seconds it took; None for a replayed run: reading it back is no engine's speed)
OnRecord = Callable[[Record, float | None], None]


def prompt_inputs(prompts: PromptSet, tokenizer_engine: Engine) -> list[PromptInput]:
    """Tokenize once, with one engine, so both arms are fed the very same ids; an engine that
    cannot (no tokenizer for text prompts) is named at its config's table."""
    try:
        with tokenizer_engine.scoped_env():
            return [
                PromptInput(id=p.id, token_ids=tokenizer_engine.prompt_token_ids(p), text=p.text)
                for p in prompts.prompts
            ]
    except ConfigError as e:
        raise located(e, *tokenizer_engine.configured_at) from None


def _timed(rec: Record, seconds: float, engine: Engine) -> Record:
    """Fill in the wall clock the gate measured when the engine reported none; never for a replayed
    run, whose wall clock is reading a file (report.md would show it as the capture's speed)."""
    if engine.replays_run or (rec.timing is not None and rec.timing.total_s is not None):
        return rec
    return replace(rec, timing=Timing(ttft_s=rec.timing.ttft_s if rec.timing else None, total_s=seconds))


def _generate(engine: Engine, inputs: Sequence[PromptInput], sampling: Sampling, runs: int):
    """Yield (record, seconds) per prompt. One run: the engine gets every prompt and batches as
    its own `batch` option says. K runs: one prompt per call, K calls in a row, samples kept."""
    if runs == 1:
        t0 = time.perf_counter()
        for rec in engine.generate(inputs, sampling):
            dt, t0 = time.perf_counter() - t0, time.perf_counter()
            yield (rec if rec.error else _timed(rec, dt, engine)), dt
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
                first = _timed(rec, dt, engine)
        if first is None:
            continue
        seconds = first.timing.total_s if first.timing and first.timing.total_s else 0.0
        yield (first if first.error else replace(first, samples=tuple(samples))), seconds


def _resumable(run: Run, inputs: Sequence[PromptInput]) -> set[str]:
    """The prompts an interrupted run already did: valid, non-error records of this prompt set,
    fed the very ids the gate feeds now (else the tokenizer changed and the run cannot go on)."""
    want = {p.id: p.token_ids for p in inputs}
    keep = set()
    for rec in run.records.values():
        if rec.error is not None or rec.id not in want:
            continue
        if rec.prompt_token_ids != want[rec.id]:
            raise InputError(
                f"prompt {rec.id!r} was fed other token ids than the prompt set tokenizes to now; "
                "the tokenizer changed, so this run cannot be continued",
                path=run.path,
            )
        keep.add(rec.id)
    return keep


def _check_same_engine(before: EngineInfo, now: EngineInfo, path: Path, *, started: bool = True) -> None:
    """A run is what one engine produced: a resumed run must come from the same versions and
    the same model files (the digest of its weights, where the engine states one). Before
    start only the digest is known (an engine's versions come with its hello)."""
    changed = []
    if started and before.versions and now.versions and before.versions != now.versions:
        changed = [f"{k} {before.versions.get(k)} -> {now.versions.get(k)}"
                   for k in sorted(before.versions.keys() | now.versions.keys())
                   if before.versions.get(k) != now.versions.get(k)]
    was, digest = before.options.get("model_digest"), now.options.get("model_digest")
    if was != digest and (was or digest):
        changed.append(f"model_digest {was} -> {digest}")
    if changed:
        raise ConfigError(f"the {path.name} arm's engine changed since this run was interrupted "
                          f"({', '.join(changed)}); start a new gate", path=str(path))


def finished_run(run: Run, ids: Sequence[str]) -> bool:
    """Complete, with a valid non-error record for every prompt: nothing left to generate."""
    return run.complete and all(i in run.records and run.records[i].error is None for i in ids)


def unclean(run: Run, tolerance: float = DEFAULT_GREEDY_TOLERANCE) -> list[str]:
    """The prompts of a run that errored or were not decoded greedily, in words."""
    out = []
    for rec in run.records.values():
        if rec.error is not None:
            out.append(f"{rec.id!r} errored")
        elif (v := greedy_violation(rec, tolerance)) is not None:
            out.append(f"{rec.id!r} is not greedy at position {v.position}")
    return out


def _never_started(writer: RunWriter, engine: Engine, e: Exception) -> EngineError:
    """A start-up failure is the engine's, once, not the first prompt's: no prompt was sent."""
    why = str(e) if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
    msg = f"the {engine.kind} engine never started (no prompt was sent): {why}"
    writer.fail(msg)
    return EngineError(msg)


def run_arm(
    engine: Engine,
    inputs: Sequence[PromptInput],
    sampling: Sampling,
    out_dir: str | Path,
    *,
    prompt_set: PromptSet,
    runs: int = 1,
    on_record: OnRecord | None = None,
    resume_from: Run | None = None,
    seal_key: str | None = None,
    strict: bool = False,
    shard: Mapping[str, Any] | None = None,
) -> Run:
    """Generate every prompt (K times when runs > 1) and write the run directory.

    `resume_from` (the interrupted run in out_dir) keeps the prompts it already did and
    generates only the rest, appending to it; with nothing left the engine is not started.
    On an engine failure the run is closed as failed with the prompt it died on and the
    records done so far, and the EngineError propagates (exit 3). `seal_key` seals each
    record line (a gate's arm, runs/seal.py). `strict` (`strict-gate run`) closes a run with
    errored or non-greedy prompts as failed, records kept, and raises IncompleteRunError.
    `shard` (`--shard I/N`, shards/spec.py) is written as the manifest's `prompt_set.shard`.
    """
    out = Path(out_dir)
    if engine.writes_log:
        out.mkdir(parents=True, exist_ok=True)
        engine.set_log_path(RunDir(out).engine_log)
    keep: set[str] = set()
    if resume_from is None:
        manifest = Manifest(
            engine=engine.info(),
            prompt_set={
                "name": prompt_set.name, "sha256": prompt_set.sha256, "count": len(prompt_set), "ids": prompt_set.ids,
            } | ({"shard": dict(shard)} if shard else {}),
            sampling=sampling,
            created=now_iso(),
            runs=runs,
        )
    else:
        _check_same_engine(resume_from.manifest.engine, engine.info(), out, started=False)  # the files, before a load
        keep = _resumable(resume_from, inputs)
        inputs = [p for p in inputs if p.id not in keep]
        entry = {"at": now_iso(), "kept": len(keep), "remaining": len(inputs)}
        manifest = replace(resume_from.manifest, resumed=(*resume_from.manifest.resumed, entry))
    writer = RunWriter(out, manifest, keep=keep, seal_key=seal_key)
    pending = [p.id for p in inputs]  # pending[0] is the prompt in flight when an engine dies
    current = pending[0] if pending else None
    started = False
    try:
        if inputs or resume_from is None:
            with engine.scoped_env(), engine_log(RunDir(out).engine_log, engine.log_libraries):
                engine.start()
                started = True
                # Describe the engine again once started: versions and server facts are known now.
                info = engine.info()
                if resume_from is not None:
                    _check_same_engine(resume_from.manifest.engine, info, out)
                writer.describe(info)
                vocab = vocab_size(info)
                for rec, seconds in _generate(engine, inputs, sampling, runs):
                    problem = None if rec.error is not None else audit_record(rec, sampling.max_tokens, vocab)
                    if problem is not None:  # the engine broke the run format: an engine failure
                        raise EngineError(f"{engine.kind} engine broke the run format on prompt {rec.id!r}: {problem}")
                    if rec.id in pending:
                        pending.remove(rec.id)
                    current = pending[0] if pending else None
                    writer.add(rec)
                    if on_record is not None:
                        on_record(rec, None if engine.replays_run else seconds)
    except StrictGateError as e:
        if isinstance(e, EngineError) and not started:
            raise _never_started(writer, engine, e) from None
        writer.fail(str(e), failed_prompt=current)
        if isinstance(e, EngineError) and current and current not in str(e):
            raise EngineError(f"{e} (while on prompt {current!r})") from None
        raise
    except KeyboardInterrupt:
        writer.fail("interrupted (Ctrl-C)", failed_prompt=current)
        raise
    except Exception as e:  # an engine bug: keep what was done, say where it died
        if not started:
            raise _never_started(writer, engine, e) from e
        writer.fail(f"{type(e).__name__}: {e}", failed_prompt=current)
        raise EngineError(f"{engine.kind} engine failed on prompt {current!r}: {type(e).__name__}: {e}") from e
    extra = {}
    if runs > 1 or strict:
        done = load_run(out, allow_incomplete=True)
        bad = unclean(done) if strict else []
        if bad:
            msg = f"{len(bad)} prompt(s) without a valid greedy record: {', '.join(bad[:5])}"
            writer.fail(msg)
            raise IncompleteRunError(f"{msg}; the run is marked failed, its records kept", path=str(out))
        if runs > 1:
            extra["determinism"] = determinism_summary(list(done.records.values()))
    writer.finish(**extra)
    return load_run(out)
