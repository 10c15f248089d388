"""Hand-built runs for tests: records with chosen tokens and logprobs, written as real run dirs."""

from __future__ import annotations

from pathlib import Path

from strict_gate.runs.records import (
    EngineInfo,
    Manifest,
    Record,
    RunWriter,
    Sampling,
    now_iso,
    sort_topk,
)


def step(*pairs: tuple[int, float]):
    return sort_topk(pairs)


def confident(token: int, lp: float = -0.01, runner_up: int | None = None, gap: float = 3.0):
    """A step where `token` wins by `gap` nats over the runner-up."""
    other = runner_up if runner_up is not None else token + 1000
    return step((token, lp), (other, lp - gap), (other + 1, lp - gap - 1.0))


def rec(pid: str, tokens, *, prompt=(1, 2, 3), tops=None, finish=None, samples=None, error=None) -> Record:
    tokens = tuple(tokens)
    if tops is None and error is None:
        tops = tuple(confident(t) for t in tokens)
    return Record(
        id=pid,
        prompt_token_ids=tuple(prompt),
        token_ids=tokens if error is None else (),
        finish_reason=None if error else (finish or "stop"),
        top_logprobs=None if tops is None else tuple(tops),
        samples=None if samples is None else tuple(tuple(s) for s in samples),
        error=error,
    )


def write_run(path: Path, records, *, sha="0" * 64, max_tokens=4, top=5, model="m", finish=True) -> Path:
    manifest = Manifest(
        engine=EngineInfo(kind="hand", model=model),
        prompt_set={"name": "hand", "sha256": sha, "count": len(records)},
        sampling=Sampling(max_tokens, top),
        created=now_iso(),
    )
    w = RunWriter(path, manifest)
    for r in records:
        w.add(r)
    if finish:
        w.finish()
    return path


def child_pid(parent_pid: int, marker: bytes) -> int | None:
    """The child of parent_pid whose command line holds marker (an engine the gate started),
    found through /proc (Linux)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent_pid and marker in cmd:
            return int(stat.parent.name)
    return None
