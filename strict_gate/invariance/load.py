"""An `InvarianceResult` back from the JSON it writes (report.json's `invariance`), so a command
that rewrites a finished report (diagnose, localize, resume) keeps the invariance section it
did not redo.

The body is decoded by msgspec into the shapes below, one per `to_json`: a missing key, a
wrong type, an unknown status, verdict or policy, or a key `to_json` never writes is an
`InputError` naming the field (`invariance: field variants[0].divergences[0].status: ...`).

What `to_json` derives is derived again, not read: the verdicts of the whole and its exit code,
each variant's near-ties and cost, the acceptance rate and mean accepted length, a moved
prompt's label, and a candidate variant's prompts classified beside the reference's
(`beside_reference`, moves.py): derived again from both arms' variants, for a body that says it
was paired. Two things a moved prompt does not write are restored from what is written: a
speculative variant's moves are exact (the variant's `exact`), and what the variant varied (its
`cause`, named in the label: "prefill-chunk dependence") is read from the label, or from the
variant's name where the label does not say it, as the runner names it (run.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from strict_gate.core.sections import Shape, read_section
from strict_gate.engines.speculative import Acceptance
from strict_gate.errors import InputError
from strict_gate.invariance.config import InvariancePolicy, VariantKind
from strict_gate.invariance.moves import CANDIDATE, REFERENCE, paired
from strict_gate.invariance.verdict import (
    CAUSES,
    LABELS,
    InvarianceResult,
    Moved,
    Pairing,
    VariantResult,
    VariantVerdict,
)
from strict_gate.judge.compare import Status

Count = Annotated[int, msgspec.Meta(ge=0)]
Repeat = Annotated[int, msgspec.Meta(ge=1)]



class _Acceptance(Shape, frozen=True):
    drafted: Count
    accepted: Count
    drafts: Count | None
    acceptance_rate: float | None  # derived
    mean_accepted_length: float | None  # derived
    replies: Count
    replies_without: Count
    replies_drafting: Count


class _Moved(Shape, frozen=True):
    id: str
    run: Repeat
    status: Status
    label: str  # derived: the status, the cause, exact or not
    position: Count | None
    baseline_token: int | None
    variant_token: int | None
    baseline_gap: float | None
    variant_gap: float | None
    reason: str
    baseline_tokens: list[int]
    variant_tokens: list[int]
    outputs: Count = 2  # a report written before it has none


class _Variant(Shape, frozen=True):
    name: str
    arm: str
    verdict: VariantVerdict
    runs: list[str]
    prompts_total: Count
    prompts_exact: Count
    positions_total: Count
    positions_matched: Count
    distinct_outputs: Count
    prompts_distinct: Count
    near_ties: Count  # derived
    divergences: list[_Moved]
    problems: list[str]
    seconds: float | None
    baseline_seconds: float | None
    cost: float | None  # derived
    exact: bool
    acceptance: _Acceptance | None
    # derived (moves.py); a report written before it has none
    beside_reference: dict[Pairing, list[str]] | None = None


class InvarianceSection(Shape, frozen=True):
    verdict: VariantVerdict  # derived
    policy: InvariancePolicy
    band: float
    exit_code: int  # derived
    config: dict[str, Any]
    baselines: dict[str, str]
    problems: list[str]
    variants: list[_Variant]


def load_invariance(d: dict) -> InvarianceResult:
    """The InvarianceResult whose `to_json()` is `d` (report.json's `invariance`); InputError
    naming the field when `d` is not such a body."""
    s = read_section(d, InvarianceSection, "invariance")
    _yardsticks_stand_beside(s.variants)
    inv = InvarianceResult(s.policy, s.band, dict(s.config), tuple(_variant(v) for v in s.variants),
                           dict(s.baselines), tuple(s.problems))
    return paired(inv) if any(v.beside_reference is not None for v in s.variants) else inv


def _yardsticks_stand_beside(variants: list[_Variant]) -> None:
    """A `yardstick` verdict is a reference variant's beside the candidate's of its name: anywhere
    else it would pass a move that fails (a hand-edited report), so it is refused."""
    beside = {v.name for v in variants if v.arm == CANDIDATE}
    for i, v in enumerate(variants):
        if v.verdict == VariantVerdict.YARDSTICK and (v.arm != REFERENCE or v.name not in beside):
            raise InputError(f"report.json's invariance: field variants[{i}].verdict: 'yardstick' is only a reference "
                             "variant's, beside a candidate variant of the same name")


def _variant(v: _Variant) -> VariantResult:
    a = v.acceptance
    acceptance = None if a is None else Acceptance(a.drafted, a.accepted, a.drafts, a.replies, a.replies_without,
                                                   a.replies_drafting)
    return VariantResult(
        name=v.name, arm=v.arm, runs=tuple(v.runs), prompts_total=v.prompts_total, prompts_exact=v.prompts_exact,
        positions_total=v.positions_total, positions_matched=v.positions_matched,
        distinct_outputs=v.distinct_outputs, prompts_distinct=v.prompts_distinct,
        divergences=tuple(_moved(m, v.name, v.exact) for m in v.divergences), verdict=v.verdict,
        problems=tuple(v.problems), seconds=v.seconds, baseline_seconds=v.baseline_seconds, exact=v.exact,
        acceptance=acceptance,
    )


def _moved(m: _Moved, variant: str, exact: bool) -> Moved:
    return Moved(m.id, m.run, m.status, m.position, m.baseline_token, m.variant_token, m.baseline_gap,
                 m.variant_gap, m.reason, tuple(m.baseline_tokens), tuple(m.variant_tokens),
                 _cause(m, variant, exact), exact, m.outputs)


def _cause(m: _Moved, variant: str, exact: bool) -> str:
    """What the variant varied: named in a near-tie's or a dependence's label ("prefill-chunk
    dependence"), else from the variant's name ("chunked_prefill-64"), as run.py names it."""
    if not exact and m.status in LABELS:
        pattern = re.escape(LABELS[m.status]).replace(re.escape("{}"), "(.+)")
        if (hit := re.fullmatch(pattern, m.label)) is not None:
            return hit.group(1)
    kind = next((k for k in VariantKind if variant == k.value or variant.startswith(f"{k.value}-")), None)
    return CAUSES.get(kind, "batch") if kind is not None else "batch"
