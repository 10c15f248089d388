"""Drift before a flip: the reference's tokens teacher-forced through the candidate (`drift =
true` in a gate, docs/drift.md). It informs; it never changes the verdict.

One folder, in two ranks (docs/architecture.md). Its core, which gate/ may import:
`measure.py` (the figures, `DriftReport`, and the KL estimator). Its face, above gate/ and
report/, which the two registries reach by name: `feature.py` (the gate's hooks, in
gate/feature.py's FEATURES) and `render.py` (each format, and its `SECTION` in
report/sections.py's SECTIONS). The near-tie's matched-prefix drift, which every comparison
computes without teacher forcing, is the judge's (judge/prefix_drift.py).
"""
