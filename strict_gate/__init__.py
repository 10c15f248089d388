"""strict-gate: greedy token-equality gates between an inference engine and vLLM."""

__version__ = "0.1.0"
