"""What compares stored runs without an engine: `strict-gate compare` (compare.py)."""
