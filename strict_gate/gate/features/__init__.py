"""The gate's built-in features, one module each, registered in gate/feature.py's FEATURES."""
