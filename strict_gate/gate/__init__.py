"""The gate: its config, one arm's run, the phases of a gate, resume, re-scoring, the bench."""
