"""The gate's built-in features not yet in a folder of their own (localize), one module each,
registered in gate/feature.py's FEATURES; speed, noise, drift and invariance keep theirs in
their folders (speed/feature.py, noise/feature.py, drift/feature.py, invariance/feature.py)."""
