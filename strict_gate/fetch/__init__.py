"""Models from a package registry, made usable once: `strict-gate model convert`."""
