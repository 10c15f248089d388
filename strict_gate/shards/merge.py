"""`strict-gate merge`: N shard run directories joined into one run, after checking that they
are the shards of one run. Every shard's manifest must name the same engine (kind, model, model
digest, versions), sampling, K and prompt set (sha256, size, N); the indices 0..N-1 must each
appear once; every shard must be complete, hold exactly its own prompts and share none with
another. Anything else is exit 2 naming the shard and the prompt. The merged run is an ordinary
run (strict-gate/run@1) in the set's order, its manifest naming each shard it came from, so a
gate reads it as `kind = "recorded"`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strict_gate.errors import InputError
from strict_gate.runs.determinism import determinism_summary
from strict_gate.runs.output import staged_run_dir
from strict_gate.runs.prompts import load_prompts
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import Manifest, Run, now_iso
from strict_gate.runs.writer import RunWriter
from strict_gate.shards.spec import Shard, order


@dataclass(frozen=True)
class ShardRun:
    path: Path
    shard: Shard
    total: int  # the whole set's size
    run: Run

    @property
    def ids(self) -> list[str]:
        return self.run.manifest.prompt_ids or []


def read_shard(path: Path) -> ShardRun:
    """A complete shard run, its `prompt_set.shard` checked; InputError naming the directory."""
    run = load_run(path)  # an unfinished or failed run is refused here, naming it
    desc = run.manifest.prompt_set.get("shard")
    if not isinstance(desc, dict) or not all(isinstance(desc.get(k), int) and not isinstance(desc.get(k), bool)
                                             for k in ("index", "of", "count")):
        raise InputError("not a shard run: its manifest has no prompt_set.shard {index, of, count} "
                         "(written by strict-gate run --shard I/N)", path=str(path))
    shard = Shard.parse(f"{desc['index']}/{desc['of']}")
    ids = run.manifest.prompt_ids
    if ids is None:
        raise InputError("a shard run must list its prompt ids (prompt_set.ids)", path=str(path))
    want = len(range(shard.index, desc["count"], shard.of))
    if len(ids) != want:
        raise InputError(f"shard {shard.index}/{shard.of} of {desc['count']} prompts holds {want} of them by the "
                         f"rule (prompt k to shard k mod N); its manifest lists {len(ids)}", path=str(path))
    missing = [pid for pid in ids if pid not in run.records]
    if missing:
        raise InputError(f"prompt {missing[0]!r} of this shard has no record ({len(missing)} missing)", path=str(path))
    extra = sorted(set(run.records) - set(ids))
    if extra:
        raise InputError(f"prompt {extra[0]!r} is not one of this shard's prompts", path=str(path))
    return ShardRun(path, shard, desc["count"], run)


def _same_run(a: ShardRun, b: ShardRun) -> None:
    """Shard b was made as shard a was: same engine, sampling, K and prompt set."""
    ma, mb = a.run.manifest, b.run.manifest
    checks = (
        ("engine kind", ma.engine.kind, mb.engine.kind),
        ("model", ma.engine.model, mb.engine.model),
        ("model digest", ma.engine.options.get("model_digest"), mb.engine.options.get("model_digest")),
        ("engine versions", ma.engine.versions, mb.engine.versions),
        ("sampling", ma.sampling, mb.sampling),
        ("runs per prompt", ma.runs, mb.runs),
        ("prompt set sha256", ma.prompt_set.get("sha256"), mb.prompt_set.get("sha256")),
        ("prompt set size", a.total, b.total),
        ("number of shards", a.shard.of, b.shard.of),
    )
    for what, x, y in checks:
        if x != y:
            raise InputError(f"not a shard of the same run as {a.path}: {what} {y!r}, there {x!r}", path=str(b.path))


def check_shards(shards: Sequence[ShardRun]) -> list[str]:
    """The whole set's ids in its order, once the shards are proven to be one run's, disjoint and
    complete."""
    if not shards:
        raise InputError("no shard directories given")
    for s in shards[1:]:
        _same_run(shards[0], s)
    by_index: dict[int, ShardRun] = {}
    for s in shards:
        if s.shard.index in by_index:
            raise InputError(f"shard {s.shard.index}/{s.shard.of} is given twice (also {by_index[s.shard.index].path})",
                             path=str(s.path))
        by_index[s.shard.index] = s
    n = shards[0].shard.of
    absent = [i for i in range(n) if i not in by_index]
    if absent:
        raise InputError(f"shard {absent[0]}/{n} is missing: {len(shards)} of {n} shards given")
    seen: dict[str, Path] = {}
    for s in shards:
        for pid in s.ids:
            if pid in seen:
                raise InputError(f"prompt {pid!r} is in two shards (also {seen[pid]})", path=str(s.path))
            seen[pid] = s.path
    return order([by_index[i].ids for i in range(n)])


def _check_prompts(ids: list[str], sha256: Any, prompts: Path) -> None:
    ps = load_prompts(prompts)
    if ps.sha256 != sha256:
        raise InputError(f"the shards were made from another prompt set (sha256 {sha256!r}, this file {ps.sha256!r})",
                         path=str(prompts))
    for want, got in zip(ps.ids, ids, strict=False):
        if want != got:
            raise InputError(f"prompt {want!r} of the set is not where the shards put it ({got!r})", path=str(prompts))


def merge_shards(dirs: Sequence[str | Path], out: str | Path, *, prompts: Path | None = None,
                 force: bool = False) -> Run:
    """Join the shard runs in `dirs` into one run at `out` (replaced only when `force`)."""
    shards = [read_shard(Path(d)) for d in dirs]
    ids = check_shards(shards)
    first = shards[0].run.manifest
    if prompts is not None:
        _check_prompts(ids, first.prompt_set.get("sha256"), prompts)
    records = {pid: rec for s in shards for pid, rec in s.run.records.items()}
    manifest = Manifest(
        engine=first.engine, sampling=first.sampling, created=now_iso(), runs=first.runs,
        prompt_set={"name": first.prompt_set.get("name"), "sha256": first.prompt_set.get("sha256"), "count": len(ids),
                    "ids": ids,
                    "merged": [{"index": s.shard.index, "of": s.shard.of, "path": str(s.path), "records": len(s.ids),
                                "created": s.run.manifest.created, "finished": s.run.manifest.finished,
                                "engine_versions": s.run.manifest.engine.versions}
                               for s in sorted(shards, key=lambda s: s.shard.index)]},
    )
    with staged_run_dir(out, force=force) as staged:
        writer = RunWriter(staged, manifest)
        for pid in ids:
            writer.add(records[pid])
        extra = {"determinism": determinism_summary([records[p] for p in ids])} if first.runs > 1 else {}
        writer.finish(**extra)
    return load_run(out)
