"""`strict-gate check-engine ENGINE.toml`: a conformance run for one arm, in about a minute.

A few prompts through the engine's own class, each reply put through the gate's own readers
and run audit, and a checklist: the hello, greedy, determinism, max_tokens, EOS ids,
ignore_eos, top_logprobs counts, exact ties, score and prefill/decode consistency, token
events, unknown and malformed requests, timing, EOF. Each failure names the section of
docs/engine-protocol.md to read. The checks are listed in run.py's CHECKS.
"""

from strict_gate.check_engine.checklist import Check, Checklist, Status
from strict_gate.check_engine.run import CHECKS, check_engine, load_engine_arm

__all__ = ["CHECKS", "Check", "Checklist", "Status", "check_engine", "load_engine_arm"]
