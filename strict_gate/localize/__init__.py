"""Localisation: where along the depth a divergence first shows (docs/localize.md).

Both arms run the same ids once more and dump activations at canonical points (`points`);
the dumps are audited (`capture`) and checked to take the path that produced the divergence
(`reproduce`, per arm in `arm`), compared point by point (`compare`), and the first point
beyond tolerance and the error curve become a `judge.localization.Localization` (`run`); a
layer first beyond is narrowed to its ops (`narrow`), grafted at ops where the candidate can
(`graft`): wrong alone, or drift from earlier.

One folder, in two ranks (docs/architecture.md). Its core, which gate/ may import: the modules
above and `config.py` (the `localize` key of a gate config, and `cannot_localize`, whether a
gate's arms can). Its face, above gate/ and report/, which only the CLI imports and the two
registries reach by name: `feature.py` (the gate's hook, in gate/feature.py's FEATURES),
`phase.py` (the phase in a gate, and `strict-gate localize` on a finished one) and `render.py`
(each format, and its `SECTION` in report/sections.py's SECTIONS). The figures it makes live in
judge/localization.py: a `GateResult` holds them, and the judge ranks below localize/. Each
engine's dump is its own (engines/).
"""
