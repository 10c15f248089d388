"""The gate's built-in features not yet in a folder of their own (speed, localize), one module
each, registered in gate/feature.py's FEATURES; noise, drift and invariance keep theirs in
their folders (noise/feature.py, drift/feature.py, invariance/feature.py)."""
