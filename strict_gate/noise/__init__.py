"""The reference's own noise: how far the oracle disagrees with itself (docs/noise.md).

`strict-gate noise CONFIG` measures a reference against itself under variations that should
not matter (its K captured runs, batch 1 against batched, its prefill argmax against its
decode argmax, chunked prefill, a second build) into a sealed profile beside its baseline;
a gate then judges each candidate flip against that profile, and `band = "measured"` takes
its near-tie band from it.

One folder, in two ranks (docs/architecture.md). Its core, which gate/ and report/ may import:
`profile.py`, `flips.py`, `kruns.py`, `measure.py`, `band.py`, `ulp.py`, `annotate.py`, and
`setting.py` (a gate's `[noise]` setting and its profile checked against the reference). Its
face, above gate/ and report/, which only the CLI imports and the two registries reach by name:
`feature.py` (the gate's hook, in gate/feature.py's FEATURES), `render.py` (each format, and
its `SECTION` in report/sections.py's SECTIONS) and `command.py` (`strict-gate noise`).
"""
