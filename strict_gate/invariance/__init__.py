"""The invariance variants: tokens must not depend on batch, concurrency, chunked prefill or the prefix cache.

One folder, in two ranks (docs/architecture.md). Its core, which gate/, report/ and noise/ may
import: `config.py` (the `[invariance]` table; `boundaries.py`, the chunk `state_boundaries` reads from the model), `variants.py` (a variant as an engine),
`run.py` (the variants run for an arm, through a runner handed in), `continuation.py` and
`verdict.py` (the verdict against the arm's batch-1 run), `moves.py` (with both arms, the
candidate's moves judged against the reference's own). Its face, above gate/ and report/,
which only the CLI imports and the two registries reach by name: `feature.py` (the gate's hook,
in gate/feature.py's FEATURES), `render.py` (each format, its `SECTION` in
report/sections.py's SECTIONS, and the files of `strict-gate invariance`) and `phase.py` (the
phase in a gate, and `strict-gate invariance` alone).
"""
