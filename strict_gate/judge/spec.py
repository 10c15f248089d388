"""What a gate is judged by, in one value fixed before any engine runs.

The gate, a resumed gate, a re-diagnosis and `compare` each used to rebuild the judge's
dozen parameters from their own sources (the config, the command line, gate-state.json,
an old report.json). A GateSpec is built once from those, checked once, and is the one
shape these settings reach disk in: report.json's "policy", "band", "prompt_set" and
"config", and gate-state.json's "config", "policy", "band" and prompt set sha256.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strict_gate.errors import ConfigError, InputError
from strict_gate.judge.compare import check_band
from strict_gate.judge.policies import RULES, Rule
from strict_gate.judge.policy import Policy, check_policy
from strict_gate.runs.audit import DEFAULT_GREEDY_TOLERANCE
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import Sampling


def valid_band(band: float) -> float:
    """A band from the command line, a config or a caller: finite and >= 0, else bad input."""
    try:
        return check_band(band)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class ConfigRef:
    """Where a gate's config came from: `strict-gate diagnose` and `gate --resume` re-read the
    report directory's copy, resolving its relative paths against base_dir as the gate did."""

    path: str
    base_dir: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "base_dir": self.base_dir}

    @classmethod
    def from_json(cls, d: object, *, where: str) -> ConfigRef:
        if not isinstance(d, Mapping) or not all(isinstance(d.get(k), str) for k in ("path", "base_dir")):
            raise InputError('"config" must be an object with "path" and "base_dir" strings', path=where)
        return cls(d["path"], d["base_dir"])


@dataclass(frozen=True)
class PromptSetRef:
    """The prompts a gate judges: the ids it expects (a prompt missing from both runs is then
    reported missing, not silently absent; None: whatever ids the runs hold) and the set as
    the report describes it, kept as its source (the prompt file, a run manifest, an earlier
    report) said it."""

    described: Mapping[str, Any]  # report.json's "prompt_set": name, sha256, count, path
    ids: tuple[str, ...] | None = None

    @classmethod
    def of(cls, ps: PromptSet, path: str) -> PromptSetRef:
        return cls({"name": ps.name, "sha256": ps.sha256, "count": len(ps), "path": path}, tuple(ps.ids))

    @classmethod
    def stored(cls, described: Mapping[str, Any], ids: Sequence[str] | None) -> PromptSetRef:
        return cls(dict(described), None if ids is None else tuple(ids))

    @property
    def sha256(self) -> str | None:
        sha = self.described.get("sha256")
        return sha if isinstance(sha, str) else None


@dataclass(frozen=True)
class GateSpec:
    """Everything the judgement depends on besides the two runs. Checked when built: an
    unknown policy or a band that is not a finite number >= 0 is bad input (exit 2). A Policy
    was checked where its name was read (gate_spec, a config, a state file); a name is checked here."""

    name: str
    prompt_set: PromptSetRef
    sampling: Sampling
    policy: Policy
    band: float
    greedy_tolerance: float = DEFAULT_GREEDY_TOLERANCE
    config: ConfigRef | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Policy):
            object.__setattr__(self, "policy", check_policy(self.policy))
        object.__setattr__(self, "band", valid_band(self.band))

    @property
    def rule(self) -> Rule:
        """The policy's rule: what the judgement applies."""
        return RULES[self.policy]
