"""A battery's figures and its provenance file (strict-gate/battery@1), written beside the set.

The prompt set itself is an ordinary prompt set (it hashes like any other and any gate runs
it); `<name>.provenance.json` says where it came from: the pool files and their sha256, the
reference engine and its versions, T, K, the rule and its parameters, and each chosen
prompt's margins and expected flip probability at a few perturbation scales. A provenance
whose prompt-set sha256 is not the set's own is refused: the set was edited after it was built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strict_gate.battery.margins import MarginProfile, battery_detection, prompt_flip_probabilities
from strict_gate.errors import InputError
from strict_gate.runs.prompts import MAX_PROMPT_BYTES, PromptSet, check_regular_file

SCHEMA = "strict-gate/battery@1"
SCALES = (0.001, 0.003, 0.01, 0.03, 0.1)  # nats of logit noise the figures are given at
BINS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, math.inf)  # smallest-margin histogram edges, nats
RANDOM_DRAWS = 500


def provenance_path(prompt_set: Path) -> Path:
    return prompt_set.with_name(prompt_set.stem + ".provenance.json")


def scale_key(s: float) -> str:
    return f"{s:g}"


@dataclass(frozen=True)
class PromptFigures:
    id: str
    group: str
    figures: dict  # MarginProfile.to_json(band)
    p_flip: dict[str, float]  # scale -> P(flip)

    @property
    def smallest(self) -> float | None:
        return self.figures.get("smallest_margin")

    def to_json(self) -> dict:
        return {"id": self.id, "group": self.group, **self.figures, "p_flip": self.p_flip}


@dataclass(frozen=True)
class Sensitivity:
    """What a battery can see: per prompt, and as a whole, at each scale."""

    band: float
    scales: tuple[float, ...]
    prompts: tuple[PromptFigures, ...]
    detection: dict[str, float]  # scale -> P(at least one prompt flips)
    histogram: tuple[int, ...]  # prompts per BINS interval of their smallest margin

    def to_json(self) -> dict:
        return {"band": self.band, "scales": list(self.scales), "detection": self.detection,
                "histogram": {"edges": [e if math.isfinite(e) else None for e in BINS], "counts": list(self.histogram)},
                "prompts": [p.to_json() for p in self.prompts]}


def histogram(smallest: Sequence[float]) -> tuple[int, ...]:
    counts = [0] * (len(BINS) - 1)
    for m in smallest:
        for i in range(len(counts)):
            if BINS[i] <= m < BINS[i + 1]:
                counts[i] += 1
                break
    return tuple(counts)


def sensitivity(profiles: Sequence[MarginProfile], groups: Mapping[str, str], band: float,
                scales: Sequence[float]) -> Sensitivity:
    probs = {scale_key(s): prompt_flip_probabilities(profiles, s) for s in scales}
    prompts = tuple(
        PromptFigures(p.id, groups.get(p.id, ""), p.to_json(band), {k: float(v[i]) for k, v in probs.items()})
        for i, p in enumerate(profiles)
    )
    return Sensitivity(band, tuple(scales), prompts, {k: battery_detection(v) for k, v in probs.items()},
                       histogram([p.smallest for p in profiles if p.margins]))


def random_detection(profiles: Sequence[MarginProfile], n: int, scales: Sequence[float], seed: int) -> dict[str, float]:
    """The mean detection of a random n-prompt subset of the pool (RANDOM_DRAWS seeded draws)."""
    rng = np.random.default_rng(seed)
    draws = [rng.choice(len(profiles), size=n, replace=False) for _ in range(RANDOM_DRAWS)]
    out = {}
    for s in scales:
        p = prompt_flip_probabilities(profiles, s)
        out[scale_key(s)] = float(np.mean([battery_detection(p[d]) for d in draws]))
    return out


def write_provenance(path: Path, doc: dict) -> None:
    from strict_gate.runs.records import write_json_atomic

    write_json_atomic(path, doc)


def _bad(path: Path, why: str) -> InputError:
    return InputError(f"not a battery provenance file ({SCHEMA}): {why}", path=str(path))


def load_provenance(prompt_set: PromptSet) -> dict:
    """The provenance beside a built battery, checked against the set it describes."""
    path = provenance_path(Path(prompt_set.path))
    try:
        check_regular_file(path, "a battery provenance file", MAX_PROMPT_BYTES)
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no provenance beside this prompt set: it was not built by `strict-gate battery build` "
                         "(for a hand-written set, use `strict-gate battery score`)", path=str(path)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg} (column {e.colno})", path=str(path), line=e.lineno) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read: {e}", path=str(path)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(path, f"schema is {doc.get('schema') if isinstance(doc, dict) else None!r}")
    for key, kind in (("prompt_set", dict), ("sensitivity", dict), ("pool", dict), ("reference", dict), ("rule", dict)):
        if not isinstance(doc.get(key), kind):
            raise _bad(path, f'"{key}" is missing or not an object')
    if doc["prompt_set"].get("sha256") != prompt_set.sha256:
        raise InputError(f"the prompt set's sha256 is {prompt_set.sha256}, the provenance says "
                         f"{doc['prompt_set'].get('sha256')}: the set changed after it was built", path=str(path))
    ids = [p.get("id") for p in doc["sensitivity"].get("prompts", []) if isinstance(p, dict)]
    if ids != prompt_set.ids:
        raise InputError("the provenance's prompts are not the set's, in order", path=str(path))
    return doc
