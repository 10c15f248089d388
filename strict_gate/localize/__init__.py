"""Localisation: where along the depth a divergence first shows (docs/localize.md).

Both arms run the same ids once more and dump activations at canonical points (`points`);
the dumps are audited (`capture`), compared point by point (`compare`), and the first point
beyond tolerance and the error curve become a `judge.localization.Localization` (`run`).
"""
