"""Are a baseline's K captured runs really K, and really separate runs?

The K-run variation is read from a baseline's samples, so the baseline is checked first: the
manifest's K, its determinism summary and every record's samples must agree; a baseline
captured from a replay (a recorded engine) repeated one run K times and is refused; and a
prefix cache that was on during the capture is stated for the prompts it could serve (runs
2..K of those reused run 1's prefill, so they are repeats of the decode only).
"""

from __future__ import annotations

from collections.abc import Sequence

from strict_gate.engines import engine_class
from strict_gate.errors import ConfigError, InputError
from strict_gate.runs.records import Record, Run


def _agree(rec: Record) -> bool:
    s = rec.samples or ()
    return all(x == s[0] for x in s[1:])


def check_k_runs(run: Run, *, expected: int | None = None) -> tuple[int, list[str]]:
    """The baseline's K and the notes the profile carries; InputError when it lies."""
    where, m = run.path, run.manifest
    k = m.runs
    if expected is not None and expected > 1 and k != expected:
        raise InputError(f"the config captures K = {expected} runs and the baseline holds K = {k}: re-capture it",
                         path=where)
    if "replayed_from" in m.engine.options or _replays(m.engine.kind):
        raise InputError("the baseline was captured from a stored run (a replay): its K runs are one run repeated, "
                         "not K runs of the reference", path=where)
    records = [r for r in run.records.values() if r.error is None]
    if k < 2:
        if any(r.samples for r in records):
            raise InputError(f"the manifest says K = {k} and records hold samples", path=where)
        return k, [f"the baseline holds one run (K = {k}): no repeated runs to measure"]
    lying = [r.id for r in records if r.samples is None or len(r.samples) != k]
    if lying:
        n = 0 if run.records[lying[0]].samples is None else len(run.records[lying[0]].samples or ())
        raise InputError(f"the manifest says K = {k} runs and {len(lying)} record(s) hold another number of samples "
                         f"(first: {lying[0]!r} holds {n})", path=where)
    _check_summary(m.determinism, k, records, where)
    return k, _cache_notes(m.engine.options, records, k)


def _check_summary(det: dict | None, k: int, records: Sequence[Record], where: str) -> None:
    """The manifest's determinism summary is what the samples say."""
    if not isinstance(det, dict):
        raise InputError(f"the manifest says K = {k} runs and has no determinism summary", path=where)
    split = sorted(r.id for r in records if not _agree(r))
    stated = det.get("non_deterministic")
    stated_ids = sorted(str(d.get("id")) for d in stated) if isinstance(stated, list) and all(
        isinstance(d, dict) for d in stated) else None
    want = (k, len(records), len(records) - len(split), split)
    got = (det.get("runs"), det.get("prompts_total"), det.get("prompts_deterministic"), stated_ids)
    if got != want:
        raise InputError(f"the manifest's determinism summary (runs, prompts, deterministic, split ids) = {got!r} "
                         f"disagrees with its samples {want!r}", path=where)


def _cache_notes(options: dict, records: Sequence[Record], k: int) -> list[str]:
    """With vLLM's prefix cache on, a prompt that fills a KV block was served from run 1's cache."""
    eff = options.get("effective") if isinstance(options.get("effective"), dict) else {}
    block = eff.get("block_size") if isinstance(eff, dict) else None
    if not (isinstance(eff, dict) and eff.get("enable_prefix_caching")) or not isinstance(block, int) or block < 1:
        return []
    cached = sum(1 for r in records if len(r.prompt_token_ids) >= block)
    return [f"the prefix cache was on ({block}-token blocks) during the capture: {cached} of {len(records)} "
            f"prompt(s) fill a block, so for them runs 2..{k} reused run 1's prefill"]


def _replays(kind: str) -> bool:
    """The engine kind a run's manifest names replays a stored run (a recorded engine)."""
    try:
        return engine_class(kind).replays_run
    except ConfigError:  # a kind this version does not know made it: not a replay it can name
        return False
