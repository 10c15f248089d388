"""report.json, declared once: the shape every report is written in and read back from.

`GateResult`'s builder (judge/result.py `to_json`) fills these shapes; `write_reports` writes a
report only once `written` has found every key it holds declared here with a value its type
accepts, so a key no reader knows, or a value of another type, stops the writer (a bug) rather
than reaching a file. `load_report` (judge/stored.py) decodes the same classes, so a reader
cannot expect a field the writer does not write. A field with a default is one an older
report@1 or @2 may lack; one without is in every report. Each feature's section is declared by
its feature (its `schema`, core/features.py) and checked the same way.

Numbers a rounding or an engine may give as integers are `float` (msgspec reads 1 as 1.0);
fields a reader prints but never parses (an engine's options, versions) stay `Any`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from strict_gate.core.features import entry, resolve
from strict_gate.core.sections import UndeclaredField, written
from strict_gate.judge.cascade import Later
from strict_gate.judge.compare import Status
from strict_gate.judge.policy import Policy, VerdictKind
from strict_gate.judge.tally import Flips

Count = Annotated[int, msgspec.Meta(ge=0)]
TokenId = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Doc(msgspec.Struct, frozen=True, kw_only=True):
    """Stored shapes are read-only values."""


class RescoredDoc(Doc, frozen=True):
    """One side's teacher-forced gap at a divergence (judge/compare.py's Rescored)."""

    gap: float | None = None
    why: str | None = None
    refutes: bool = False


class DivergenceDoc(Doc, frozen=True):
    position: Count | None = None
    reference_token: TokenId | None = None
    candidate_token: TokenId | None = None
    reference_gap: float | None = None
    candidate_gap: float | None = None
    reference_margin: float | None = None
    reason: str | None = None
    reference_top: list[tuple[TokenId, float | None]] | None = None
    candidate_top: list[tuple[TokenId, float | None]] | None = None
    reference_rescored: RescoredDoc | None = None  # absent: not re-scored, or a report from before
    candidate_rescored: RescoredDoc | None = None


class LaterPositionDoc(Doc, frozen=True):
    position: Count
    token: TokenId
    reference_argmax: TokenId
    kind: Later
    reference_gap: float | None = None
    candidate_gap: float | None = None
    candidate_rescored: float | None = None
    reason: str = ""


class CascadeDoc(Doc, frozen=True):
    """A diagnosis' positions after the first divergence, judged (judge/cascade.py); absent before it existed."""

    first: Count
    end: Count
    outcome: Later
    later: Count = 0
    judged: Count = 0
    flips: Count = 0
    divergent: Count = 0
    worst_gap: float | None = None
    unverified_from: Count | None = None
    why: str | None = None
    candidate_note: str | None = None
    one_sided: bool = False
    prefill_decode: list[Count] = []
    summary: str = ""
    flip_positions: list[LaterPositionDoc] = []
    divergent_positions: list[LaterPositionDoc] = []


class StepDoc(Doc, frozen=True):
    position: Count
    token: TokenId
    reference_argmax: TokenId
    gap: float | None = None


class DiagnosisDoc(Doc, frozen=True):
    id: str
    position: Count
    downstream_only: bool
    verdict: str
    decode_gap: float | None = None
    rescored_gap: float | None = None
    rescored_argmax: TokenId | None = None
    later_errors: list[Count] = []
    near_tie: bool | None = None
    candidate_rescored: RescoredDoc | None = None
    error: str | None = None
    later: CascadeDoc | None = None
    steps: list[StepDoc] = []


class MatchedDriftDoc(Doc, frozen=True):
    """|Δ logprob| over a prompt's matched positions (judge/prefix_drift.py)."""

    max_abs_dlogprob: float | None = None
    positions: Count = 0
    scale: str | None = None


class PointDiffDoc(Doc, frozen=True):
    name: str
    max_abs: float | None = None
    rel_diff: float | None = None
    cosine: float | None = None
    scale: float | None = None
    beyond: bool = False
    note: str | None = None


class ReproductionDoc(Doc, frozen=True):
    arm: str
    token: TokenId
    source: str
    chosen: TokenId | None = None
    path: str = "prefill"
    reproduced: bool | None = None  # derived from token and chosen


class LocalizationDoc(Doc, frozen=True):
    """Where a prompt first differs along the depth (judge/localization.py)."""

    prompt_id: str
    positions: list[Count]
    points: list[PointDiffDoc]
    tolerance: float
    reference_engine: str
    candidate_engine: str
    first_beyond: str | None = None
    first_differs: str | None = None  # derived
    mode: str | None = None  # derived
    grafted: list[PointDiffDoc] = []
    grafted_beyond: list[str] = []  # derived
    grafted_differs: str | None = None  # derived
    pattern: str | None = None  # derived
    reference_note: str | None = None
    error: str | None = None
    kept: str | None = None
    not_compared: list[str] = []  # derived
    reproduced: dict[str, bool | None] = {}  # derived
    reproduction: list[ReproductionDoc] = []
    ops: list[PointDiffDoc] = []
    first_beyond_op: str | None = None  # derived
    ops_not_compared: list[str] = []  # derived
    ops_grafted: list[PointDiffDoc] = []
    alone: dict[str, str] = {}
    first_beyond_op_alone: str | None = None  # derived
    op_graft_note: str | None = None
    op_graft_refused: bool = False
    dump_mode: str = "auto"
    decode: LocalizationDoc | None = None


class PromptDoc(Doc, frozen=True):
    """One prompt's row; a passing match is written in its first fields only (judge/result.py)."""

    id: str
    status: Status
    passed: bool = False
    outcome: Literal["pass", "fail", "unverified"] | None = None  # None: a report from before the every-token rule
    rule: str | None = None
    reason: str | None = None
    detail: str | None = None
    first_divergence: DivergenceDoc | None = None
    matched_positions: Count = 0
    prefix_length: Count | None = None
    reference_length: Count | None = None
    candidate_length: Count | None = None
    diagnosis: DiagnosisDoc | None = None
    matched_drift: MatchedDriftDoc | None = None
    label: str | None = None
    localization: LocalizationDoc | None = None


class FlipsDoc(Doc, frozen=True):
    """The headline's flips beside the status counts (judge/tally.py); absent before them."""

    divergent: Count = 0
    gap_unknown: Count = 0
    later_divergent: Count = 0
    prompts_later_divergent: Count = 0
    flipped_positions: Count = 0

    def flips(self) -> Flips:
        return Flips(self.divergent, self.gap_unknown, self.later_divergent, self.prompts_later_divergent,
                     self.flipped_positions)


class SummaryDoc(Doc, frozen=True):
    prompts_total: Count | None = None
    prompts_exact: Count | None = None
    positions_total: Count | None = None
    positions_matched: Count | None = None
    prefix_positions: Count | None = None
    counts: dict[Status, Count] = {}
    flips: FlipsDoc | None = None


PROMPT_SET_KEYS = ("name", "sha256", "count", "path", "ids")


class PromptSetDoc(Doc, frozen=True, omit_defaults=True):
    name: str | None = None
    sha256: str | None = None
    count: Count | None = None
    path: str | None = None
    ids: list[str] | None = None


class SamplingDoc(Doc, frozen=True):
    max_tokens: Count
    top_logprobs: Count
    temperature: float = 0.0
    ignore_eos: bool = False


class EngineOptionsDoc(Doc, frozen=True):
    """The options a reader uses; an engine's other options are kept as it wrote them."""

    replayed_from: str | None = None  # the baseline a recorded arm replays
    model_digest: str | None = None


class EngineDoc(Doc, frozen=True):
    kind: str | None = None
    model: str | None = None
    options: dict[str, Any] = {}
    env: Any = None  # the names of the variables the engine ran with, never their values
    versions: dict[str, Any] = {}  # as the engine said them: compared and printed, never parsed
    tokenizer: str | None = None

    @property
    def known(self) -> EngineOptionsDoc:
        """The options a reader relies on, typed."""
        return msgspec.convert(self.options, EngineOptionsDoc)


class EnginesDoc(Doc, frozen=True):
    reference: EngineDoc = msgspec.field(default_factory=EngineDoc)
    candidate: EngineDoc = msgspec.field(default_factory=EngineDoc)
    rescorer: EngineDoc | None = None


class RunsDoc(Doc, frozen=True):
    reference: str | None = None
    candidate: str | None = None


class ConfigDoc(Doc, frozen=True):
    path: str | None = None
    base_dir: str | None = None


class WallClockDoc(Doc, frozen=True):
    prompts: Count
    tokens: Count
    seconds: float | None  # null: a clock that gave no finite figure
    tokens_per_s: float | None = None
    median_ttft_s: float | None = None


class LaterTotalsDoc(Doc, frozen=True):
    prompts_flipped: Count = 0
    later_positions: Count = 0
    judged: Count = 0
    later_flips: Count = 0
    later_divergent: Count = 0
    prompts_divergent_later: Count = 0
    unverified: Count = 0
    prompts_unverified: Count = 0


class StatsDoc(Doc, frozen=True, omit_defaults=True):
    mean: float | None = None
    p99: float | None = None
    max: float | None = None
    estimator: str | None = None  # kl only


class PromptDriftDoc(Doc, frozen=True):
    id: str
    error: str | None = None
    positions: Count = 0
    same_top1: Count = 0
    same_top1_rate: float | None = None  # derived
    abs_dlogprob: StatsDoc = msgspec.field(default_factory=StatsDoc)
    kl: StatsDoc = msgspec.field(default_factory=StatsDoc)
    min_reference_margin: float | None = None
    positions_within_band: Count = 0
    first_top1_difference: Count | None = None
    max_abs_dlogprob_before_divergence: float | None = None


class DriftDoc(Doc, frozen=True):
    """The drift feature's section (drift/measure.py writes it); here because the history's lines
    hold its totals too."""

    band: float | None = None
    top_logprobs: Count | None = None
    scored_by: str | None = None
    seconds: dict[str, float] = {}
    prompts_scored: Count | None = None  # derived
    prompts_missing: dict[str, str] = {}  # derived
    positions: Count | None = None
    same_top1: Count | None = None
    same_top1_rate: float | None = None  # derived
    abs_dlogprob: StatsDoc | None = None
    kl: StatsDoc | None = None
    min_reference_margin: float | None = None
    positions_within_band: Count | None = None
    prompts: dict[str, PromptDriftDoc] = {}


class SectionDoc(Doc, frozen=True):
    """One feature's section (report@3's `features`): its verdict, exit contribution and figures;
    the figures are declared by the feature (its `schema`) and read back by its loader."""

    section: dict[str, Any]
    verdict: str | None = None  # None: a report@2 section, which did not say its verdict apart
    exit_code: Count | None = None


LEGACY_SECTIONS = ("speed", "invariance", "drift", "noise")  # report@2's top-level feature keys


class ReportDoc(Doc, frozen=True):
    """One gate's report.json (report@3; @1 and @2 read into it too)."""

    schema: str
    prompts: list[PromptDoc]
    name: str | None = None
    created: str | None = None
    verdict: VerdictKind | None = None
    exit_code: Count | None = None  # the gate's overall exit code (report@3)
    overall: str | None = None  # that exit code in words (report@3: "pass", "fail (invariance)", ...)
    policy: Policy | None = None
    band: float | None = None
    reasons: list[str] = []
    notes: list[str] = []
    problems: list[str] = []
    summary: SummaryDoc = msgspec.field(default_factory=SummaryDoc)
    prompt_set: PromptSetDoc | None = None
    sampling: SamplingDoc | None = None
    engines: EnginesDoc = msgspec.field(default_factory=EnginesDoc)
    runs: RunsDoc = msgspec.field(default_factory=RunsDoc)
    config: ConfigDoc | None = None
    determinism: dict[str, Any] | None = None  # the reference's K runs (gate/arm.py determinism_summary)
    rescored_by: str | None = None
    resumed: dict[str, Any] = {}  # arm -> its run's resume entries
    history: list[dict[str, Any]] = []  # history@1 lines, each checked by HistoryLine
    wall_clock: dict[str, WallClockDoc | None] = {}
    later: LaterTotalsDoc | None = None  # None: a report from before the every-token rule
    features: dict[str, SectionDoc] = {}  # every feature's section, by name (report@2's are lifted in)
    # report@2 wrote these sections at the top level; report@3 under features, lifted out on reading
    speed: dict[str, Any] | None = None  # the speed arm; speed/view.py reads it field by field
    invariance: dict[str, Any] | None = None  # the [invariance] variants; nightly/variants_diff checks them
    drift: DriftDoc | None = None
    noise: dict[str, Any] | None = None


class PartDoc(Doc, frozen=True):
    exact: Count | None = None
    matched: Count | None = None
    total: Count | None = None


class NightArmDoc(Doc, frozen=True):
    kind: str | None = None
    model: str | None = None
    versions: dict[str, Any] = {}  # as the engine said them: compared and printed, never parsed
    baseline: str | None = None


class HistoryLine(Doc, frozen=True):
    """One history@1 line (judge/history.py); report.json's `history` holds the same."""

    schema: str
    time: str | None = None
    gate: str | None = None
    verdict: VerdictKind | None = None
    prompts: PartDoc | None = None
    positions: PartDoc | None = None
    counts: dict[Status, Count] = {}
    reference: NightArmDoc | None = None
    candidate: NightArmDoc | None = None
    prompt_set_sha256: str | None = None
    commit: str | None = None
    report_dir: str | None = None
    drift: DriftDoc | None = None



def check_written(report: dict[str, Any]) -> ReportDoc:
    """A report as the writer built it (strict JSON), checked against its declared shapes, the
    report's and each feature's section's; UndeclaredField (a bug) before anything is written."""
    doc = written(report, ReportDoc)
    for name, body in (report.get("features") or {}).items():
        spec = entry(name)
        if spec is None or spec.schema is None:
            raise UndeclaredField(f"report.json: features.{name}: no registered feature declares this section")
        written(body["section"], resolve(spec.schema), f"report.json: features.{name}.section")
    return doc
