"""The run audit: a run's claims are checked, never trusted, before any comparison.

Rules are the same for runs read from disk and runs made live; a stored run that breaks
one is bad input (exit 2), a live engine that breaks one is an engine failure (exit 3).
"""

from __future__ import annotations

from strict_gate.errors import InputError
from strict_gate.records import Run


def check_comparable(reference: Run, candidate: Run) -> None:
    """Two runs are comparable only with the same prompt set (hash present), max_tokens and
    top_logprobs; otherwise bad input naming the field."""
    rm, cm = reference.manifest, candidate.manifest
    for label, run in (("reference", reference), ("candidate", candidate)):
        sha = run.manifest.prompt_set.get("sha256")
        if not isinstance(sha, str) or not sha:
            raise InputError(
                f"the {label} run records no prompt set sha256: a run of unknown prompts cannot be compared",
                path=run.path,
            )
    for field, a, b in (
        ("prompt set sha256", rm.prompt_set.get("sha256"), cm.prompt_set.get("sha256")),
        ("max_tokens", rm.sampling.max_tokens, cm.sampling.max_tokens),
        ("top_logprobs", rm.sampling.top_logprobs, cm.sampling.top_logprobs),
    ):
        if a != b:
            raise InputError(
                f"the runs are not comparable: {field} is {a!r} in the reference ({reference.path}) "
                f"and {b!r} in the candidate ({candidate.path})"
            )
