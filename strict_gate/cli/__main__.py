"""`python -m strict_gate.cli`."""

from strict_gate.cli import main

main()
