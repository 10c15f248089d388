"""Batteries built to be sensitive: prompts chosen by the reference's own top-2 margins (docs/battery.md)."""
