"""Localisation: where along the depth a divergence first shows (docs/localize.md).

Both arms run the same ids once more and dump activations at canonical points (`points`);
the dumps are audited (`capture`) and checked to take the path that produced the divergence
(`reproduce`, per arm in `arm`), compared point by point (`compare`), and the first point
beyond tolerance and the error curve become a `judge.localization.Localization` (`run`); a
layer first beyond is narrowed to its ops (`narrow`), grafted at ops where the candidate can
(`graft`): wrong alone, or drift from earlier.
"""
