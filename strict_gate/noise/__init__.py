"""The reference's own noise: how far the oracle disagrees with itself (docs/noise.md).

`strict-gate noise CONFIG` measures a reference against itself under variations that should
not matter (its K captured runs, batch 1 against batched, its prefill argmax against its
decode argmax, chunked prefill, a second build) into a sealed profile beside its baseline;
a gate then judges each candidate flip against that profile, and `band = "measured"` takes
its near-tie band from it.
"""
