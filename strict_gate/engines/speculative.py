"""Speculative decoding as an engine serves it: the settings a variant asks for, and the
acceptance counts an engine gives back (docs/engine-protocol.md, "Speculative decoding").

A greedy speculator is lossless by construction (every drafted token is checked against the
verifier's own argmax), so the invariance variant that turns it on demands the very tokens of
the plain run. The counts say whether it was worth it; they are the engine's word, checked
only against what a reply can prove (accepted <= drafted, no more accepted than emitted).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

SPECULATIVE = "speculative"  # the hello capability, the request field and the reply field
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)\s*$")  # name{labels} value


@dataclass(frozen=True)
class Speculation:
    """One speculative configuration: `method` ("ngram": prompt lookup; vLLM also knows
    "draft_model" with `model`, "mtp", "eagle"...), K drafted tokens per step."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None  # ngram: the longest n-gram looked up
    prompt_lookup_min: int | None = None
    model: str | None = None  # a draft model sharing the tokenizer (method "draft_model")

    @property
    def name(self) -> str:
        tail = "".join(f"-{k.removeprefix('prompt_lookup_')}{v}" for k, v in
                       (("prompt_lookup_max", self.prompt_lookup_max), ("prompt_lookup_min", self.prompt_lookup_min))
                       if v is not None)
        return f"{SPECULATIVE}-{self.method}-{self.num_speculative_tokens}{tail}"

    def to_json(self) -> dict:
        """The object a request carries, and vLLM's speculative_config: the keys that are set."""
        return {k: getattr(self, k) for k in _KEYS if getattr(self, k) is not None}


def _positive(entry: Mapping, key: str, where: str, *, required: bool = False) -> int | None:
    v = entry.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{where} {key} must be an integer >= 1, got {v!r}")
    return v


def read_speculation(entry: object, where: str) -> Speculation:
    """One `{ method = "ngram", num_speculative_tokens = 3 }`; ValueError says what is wrong."""
    if isinstance(entry, Speculation):  # read already (a checked table is checked again when made)
        return entry
    if not isinstance(entry, Mapping):
        raise ValueError(f'{where} must be a table such as {{ method = "ngram", num_speculative_tokens = 3 }}, '
                         f"got {entry!r}")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where} has an unknown key {unknown[0]!r}; the keys are: {', '.join(_KEYS)}")
    method = entry.get("method")
    if not isinstance(method, str) or not _NAME.fullmatch(method):
        raise ValueError(f'{where} method must be a method name such as "ngram", got {method!r}')
    model = entry.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ValueError(f"{where} model must be a non-empty string (a draft model), got {model!r}")
    k = _positive(entry, "num_speculative_tokens", where, required=True)
    lo, hi = _positive(entry, "prompt_lookup_min", where), _positive(entry, "prompt_lookup_max", where)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{where} prompt_lookup_min {lo} is above prompt_lookup_max {hi}")
    assert k is not None
    return Speculation(method, k, hi, lo, model)


def read_speculations(entries: list) -> list[Speculation]:
    """`speculative = [...]` of an [invariance] table: distinct configurations."""
    out = [read_speculation(e, f"[invariance] speculative[{i}]") for i, e in enumerate(entries)]
    names = [s.name for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"[invariance] speculative lists {twice[0]} twice")
    return out


@dataclass(frozen=True)
class Acceptance:
    """Acceptance counts of one variant's run: summed replies (a command engine) or the
    difference of an engine's counters over the run (vLLM). None: not known."""

    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of them, accepted by the verifier
    drafts: int | None = None  # verification steps that had a draft (vLLM's num_drafts)
    replies: int = 0  # replies that carried counts (command engines); 0 for counters
    replies_without: int = 0  # replies that did not: acceptance unknown there
    replies_drafting: int = 0  # replies with drafted > 0

    def __add__(self, o: Acceptance) -> Acceptance:
        drafts = None if self.drafts is None and o.drafts is None else (self.drafts or 0) + (o.drafts or 0)
        return Acceptance(self.drafted + o.drafted, self.accepted + o.accepted, drafts, self.replies + o.replies,
                          self.replies_without + o.replies_without, self.replies_drafting + o.replies_drafting)

    def since(self, earlier: Acceptance) -> Acceptance:
        """The counts added after `earlier` (a reading of the same cumulative counters)."""
        drafts = None if self.drafts is None else self.drafts - (earlier.drafts or 0)
        return Acceptance(self.drafted - earlier.drafted, self.accepted - earlier.accepted, drafts,
                          self.replies - earlier.replies, self.replies_without - earlier.replies_without,
                          self.replies_drafting - earlier.replies_drafting)

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verification step, the verifier's own token included (vLLM's convention:
        1 + accepted / drafts)."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    def to_json(self) -> dict:
        rate, mean = self.rate, self.mean_accepted_length
        return {"drafted": self.drafted, "accepted": self.accepted, "drafts": self.drafts,
                "acceptance_rate": None if rate is None else round(rate, 4),
                "mean_accepted_length": None if mean is None else round(mean, 4),
                "replies": self.replies, "replies_without": self.replies_without,
                "replies_drafting": self.replies_drafting}

    @classmethod
    def from_json(cls, d: object) -> Acceptance | None:
        if not isinstance(d, Mapping):
            return None
        ints = {k: d.get(k) for k in ("drafted", "accepted", "replies", "replies_without", "replies_drafting")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints.values()):
            return None
        drafts = d.get("drafts")
        if drafts is not None and (not isinstance(drafts, int) or isinstance(drafts, bool) or drafts < 0):
            return None
        return cls(ints["drafted"], ints["accepted"], drafts, ints["replies"],  # type: ignore[arg-type]
                   ints["replies_without"], ints["replies_drafting"])  # type: ignore[arg-type]


def reply_acceptance(obj: Mapping, emitted: int, k: int) -> Acceptance:
    """A generate reply's `"speculative": {"drafted": N, "accepted": M}` (optional "drafts"),
    checked against what the reply proves: accepted <= drafted; accepted < the tokens emitted
    (the first comes from the prefill, never from a draft); drafted <= K per later token. No
    object: acceptance unknown. ValueError names the rule a count breaks."""
    got = obj.get(SPECULATIVE)
    if got is None:
        return Acceptance(replies_without=1)
    if not isinstance(got, Mapping):
        raise ValueError(f'"{SPECULATIVE}" must be an object {{"drafted": N, "accepted": M}}, got {got!r}')
    vals = {key: got.get(key) for key in ("drafted", "accepted")}
    for key, v in vals.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f'"{SPECULATIVE}"."{key}" must be an integer >= 0, got {v!r}')
    drafted, accepted = vals["drafted"], vals["accepted"]
    assert isinstance(drafted, int) and isinstance(accepted, int)
    drafts = got.get("drafts")
    if drafts is not None and (not isinstance(drafts, int) or isinstance(drafts, bool) or drafts < 0):
        raise ValueError(f'"{SPECULATIVE}"."drafts" must be an integer >= 0, got {drafts!r}')
    if accepted > drafted:
        raise ValueError(f"accepted {accepted} draft tokens of {drafted} drafted (rule: accepted <= drafted)")
    if accepted > max(emitted - 1, 0):
        raise ValueError(f"accepted {accepted} draft tokens and emitted {emitted} tokens (rule: the first token "
                         "comes from the prefill, so at most emitted - 1 are accepted drafts)")
    if drafted > k * max(emitted - 1, 0):
        raise ValueError(f"drafted {drafted} tokens over {emitted} emitted at K = {k} (rule: at most K drafts "
                         "per verification, at most one verification per token after the first)")
    if drafts is not None and (drafts > max(emitted - 1, 0) or (drafted > 0) != (drafts > 0)):
        raise ValueError(f"drafts {drafts} for {drafted} drafted tokens and {emitted} emitted (rule: at most one "
                         "verification per token after the first, and drafts > 0 exactly when drafted > 0)")
    return Acceptance(drafted, accepted, drafts, replies=1, replies_drafting=int(drafted > 0))


# vLLM's spec-decode counters (Prometheus names, with or without the _total suffix)
VLLM_COUNTERS = {"vllm:spec_decode_num_draft_tokens": "drafted",
                 "vllm:spec_decode_num_accepted_tokens": "accepted",
                 "vllm:spec_decode_num_drafts": "drafts"}


def counters_acceptance(counters: Mapping[str, float]) -> Acceptance | None:
    """vLLM's cumulative counts as an Acceptance; None when it keeps none (no speculation, or
    its statistics are off)."""
    if not any(k in counters for k in VLLM_COUNTERS.values()):
        return None
    d = {k: round(counters.get(k, 0.0)) for k in VLLM_COUNTERS.values()}
    return Acceptance(d["drafted"], d["accepted"], d["drafts"])


def prometheus_counters(text: str) -> dict[str, float]:
    """vLLM's spec-decode counters from a server's /metrics page, summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        key = VLLM_COUNTERS.get(m.group(1).removesuffix("_total")) if m else None
        if m is None or key is None:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if math.isfinite(value):
            out[key] = out.get(key, 0.0) + value
    return out


def metric_counters(metrics) -> dict[str, float]:
    """The same counters from vllm.LLM.get_metrics() (Counter objects with name and value)."""
    out: dict[str, float] = {}
    for m in metrics:
        key = VLLM_COUNTERS.get(str(getattr(m, "name", "")).removesuffix("_total"))
        value = getattr(m, "value", None)
        if key is not None and isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = out.get(key, 0.0) + value
    return out
