"""The nightly loop on top of the gate: night-to-night diff and the summary."""
