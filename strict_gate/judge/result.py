"""The one result object every report format is written from (strict-gate/report@2)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from strict_gate.errors import ExitCode
from strict_gate.judge.cascade import Cascade, later_totals
from strict_gate.judge.compare import Comparison, Divergence, PromptComparison, Status
from strict_gate.judge.diagnose import Diagnosis
from strict_gate.judge.localization import Localization
from strict_gate.judge.policy import Verdict
from strict_gate.judge.prefix_drift import PrefixDrift
from strict_gate.judge.tally import Flips, flip_tally
from strict_gate.runs.records import EngineInfo, Record, Sampling

REPORT_SCHEMA = "strict-gate/report@3"


@dataclass(frozen=True)
class ArmWallClock:
    """Wall-clock figures of one arm in this gate (not a matched speed benchmark)."""

    prompts: int
    tokens: int
    seconds: float
    median_ttft_s: float | None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def to_json(self) -> dict:
        return {
            "prompts": self.prompts,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": None if self.tokens_per_s is None else round(self.tokens_per_s, 2),
            "median_ttft_s": None if self.median_ttft_s is None else round(self.median_ttft_s, 5),
        }


def arm_wall_clock(records: Mapping[str, Record]) -> ArmWallClock | None:
    """Summed in one pass, one record at a time: a run read from disk makes each record when it
    is looked up, and a list of all 10,000 held ~200 MiB for three numbers."""
    prompts, tokens, seconds, ttfts = 0, 0, 0.0, []
    for r in records.values():
        t = r.timing
        if r.error is not None or not t or not t.total_s:
            continue
        prompts, tokens, seconds = prompts + 1, tokens + len(r.token_ids), seconds + t.total_s
        if t.ttft_s is not None:
            ttfts.append(t.ttft_s)
    if not prompts:
        return None
    return ArmWallClock(prompts=prompts, tokens=tokens, seconds=seconds,
                        median_ttft_s=statistics.median(ttfts) if ttfts else None)


class FeatureResult(Protocol):
    """What a GateResult needs of a feature's result (speed, invariance, noise, drift, and every
    later one): its verdict in a word, its exit contribution (0: nothing against the gate) and
    its JSON. Each feature declares its result in its own folder and registers it in
    strict_gate/core/features.py; the judge imports no feature folder."""

    @property
    def exit_code(self) -> int: ...

    @property
    def section_verdict(self) -> str: ...

    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class GateResult:
    name: str
    created: str
    verdict: Verdict
    comparison: Comparison
    reference: EngineInfo
    candidate: EngineInfo
    prompt_set: dict
    sampling: Sampling
    reference_records: Mapping[str, Record]  # a RunRecords (read on demand) from compare_run_dirs
    candidate_records: Mapping[str, Record]
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    runs: dict = field(default_factory=dict)  # {"reference": path, "candidate": path}
    determinism: dict | None = None  # the reference's, when it captured K runs
    problems: tuple[str, ...] = ()  # arm failures, in words
    config: dict | None = None  # {"path", "base_dir"} of the gate config, for `strict-gate diagnose`
    notes: tuple[str, ...] = ()  # what the gate could not do (e.g. no engine to re-score with)
    rescored_by: str | None = None  # the engine that ran the teacher-forced diagnosis
    resumed: dict = field(default_factory=dict)  # arm -> its run's resume entries (an interrupted run continued)
    history: tuple[dict, ...] = ()  # the last nights of this gate (history.jsonl entries), tonight's last
    rescorer: EngineInfo | None = None  # the [rescorer] arm, when it (not the reference) re-scored
    localization: dict[str, Localization] = field(default_factory=dict)  # prompt id -> where it first differs
    # each feature's section by its name (strict_gate/core/features.py): its verdict, exit code and JSON
    features: Mapping[str, FeatureResult] = field(default_factory=dict)

    @property
    def exit_code(self) -> ExitCode:
        return overall_exit_code(self.verdict.exit_code, self.features.values())

    def feature(self, name: str) -> FeatureResult | None:
        """The named feature's result, None when the gate did not run it."""
        return self.features.get(name)

    @property
    def later(self) -> dict[str, Cascade]:
        """Each diagnosed prompt's positions after its first divergence, judged (judge/cascade.py)."""
        return {pid: dg.later for pid, dg in self.diagnoses.items() if dg.later is not None}

    @property
    def flips(self) -> Flips:
        """The headline's flips beyond the status counts (judge/tally.py), for every format."""
        return flip_tally(self.comparison.prompts, self.comparison.band, self.later)


# Which section's code the gate exits with when the tokens pass and several sections say no:
# tokens that do not verify first (exit 1), then tokens that move with the way the engine is
# driven, then an engine failure or an incomplete section, then a slower candidate.
SECTION_PRECEDENCE = (ExitCode.FAIL, ExitCode.NOT_INVARIANT, ExitCode.ENGINE_FAILURE, ExitCode.SLOWER,
                      ExitCode.BAD_INPUT)


def overall_exit_code(token_exit: ExitCode, sections: Iterable[FeatureResult]) -> ExitCode:
    """The token verdict's code when it is not 0, else the most serious of the sections' codes
    (SECTION_PRECEDENCE; docs/reading-a-report.md, "Exit codes and their precedence"): a wrong
    token is the first thing a caller must learn, and no section turns a token failure into a
    pass; a golden with `blame` may only restate exit 1 as 6 (docs/golden.md). The one rule every
    command's exit code comes from."""
    codes = {ExitCode(s.exit_code) for s in sections if s.exit_code}
    if token_exit == ExitCode.FAIL and ExitCode.REFERENCE_OFF_GOLDEN in codes:
        return ExitCode.REFERENCE_OFF_GOLDEN  # restates the failure, never a pass (docs/golden.md)
    if token_exit != ExitCode.PASS:
        return ExitCode(token_exit)
    return next((c for c in SECTION_PRECEDENCE if c in codes), ExitCode.PASS)


def overall_verdict(r: GateResult) -> tuple[str, str | None]:
    """(the gate's verdict word, the section that sets it): from the same rule as its exit code, so
    every format heads with what the exit code says. The token verdict when the tokens fail or the
    gate passes; else "fail" (or "incomplete", exit 3) and the name of the section whose code the
    gate exits with."""
    code = r.exit_code
    if code == ExitCode.REFERENCE_OFF_GOLDEN:
        return str(r.verdict.verdict), next(n for n in sorted(r.features) if r.features[n].exit_code == code)
    if code == ExitCode.PASS or r.verdict.exit_code != ExitCode.PASS:
        return str(r.verdict.verdict), None
    name = next(n for n in sorted(r.features) if ExitCode(r.features[n].exit_code) == code)
    return ("incomplete" if code == ExitCode.ENGINE_FAILURE else "fail"), name


def verdict_heading(r: GateResult) -> str:
    """ "PASS", "FAIL", "INCOMPLETE", or "FAIL (invariance)" when a section sets the exit code."""
    word, section = overall_verdict(r)
    return word.upper() + (f" ({section})" if section else "")


def with_feature(r: GateResult, name: str, section: FeatureResult | None) -> GateResult:
    """The result with the named feature's section set (None: left as it was)."""
    return r if section is None else replace(r, features={**r.features, name: section})


def section_json(section: FeatureResult) -> dict:
    """A section as report.json holds it: its verdict and exit code beside its own figures."""
    return {"verdict": section.section_verdict, "exit_code": int(section.exit_code), "section": section.to_json()}


def _div_json(d: Divergence | None) -> dict | None:
    if d is None:
        return None
    return {
        "position": d.position,
        "reference_token": d.reference_token,
        "candidate_token": d.candidate_token,
        "reference_gap": d.reference_gap,
        "candidate_gap": d.candidate_gap,
        "reference_margin": d.reference_margin,
        "reason": d.reason,
        "reference_top": None if d.reference_top is None else [list(p) for p in d.reference_top],
        "candidate_top": None if d.candidate_top is None else [list(p) for p in d.candidate_top],
        "reference_rescored": None if d.reference_rescored is None else d.reference_rescored.to_json(),
        "candidate_rescored": None if d.candidate_rescored is None else d.candidate_rescored.to_json(),
    }


def matched_drift(r: GateResult, p: PromptComparison) -> PrefixDrift | None:
    """|Δ logprob| at a prompt's matched positions before its first divergence, from both runs'
    own logprobs only: the same figure with and without the drift pass (whose teacher-forced
    figure includes the divergence position and is reported in the drift section)."""
    return p.prefix_drift


def status_label(r: GateResult, p: PromptComparison) -> str:
    """A near-tie says the magnitude of the drift its arms already had: a tie at float32
    rounding level and a tie beyond half precision are different news."""
    pd = matched_drift(r, p) if p.status == Status.NEAR_TIE else None
    return pd.near_tie_label() if pd is not None else str(p.status)


def _prompt_json(p, v, r: GateResult) -> dict:
    """Full detail for a prompt a reviewer must look at; a matching one in a few fields, so a
    10,000-prompt report stays small (there is no divergence to show); one that failed (a
    text-level match under strict) keeps its reason."""
    if p.status == Status.MATCH and v is not None and v.passed and p.id not in r.diagnoses:
        return {
            "id": p.id,
            "status": p.status,
            "passed": v.passed,
            "outcome": v.outcome,
            "rule": v.rule,
            "matched_positions": p.matched_positions,
            "reference_length": p.reference_length,
            "candidate_length": p.candidate_length,
            "first_divergence": None,
            "diagnosis": None,
            **({"detail": p.detail} if p.detail else {}),  # a text-level match says so
        }
    return {
        "id": p.id,
        "status": p.status,
        "passed": v.passed if v else False,
        "outcome": v.outcome if v else "fail",
        "rule": v.rule if v else None,
        "reason": v.reason if v else p.detail,
        "detail": p.detail or None,
        "first_divergence": _div_json(p.first_divergence),
        "matched_positions": p.matched_positions,
        "prefix_length": p.prefix_length,
        "reference_length": p.reference_length,
        "candidate_length": p.candidate_length,
        "diagnosis": r.diagnoses[p.id].to_json() if p.id in r.diagnoses else None,
        "matched_drift": pd.to_json() if (pd := matched_drift(r, p)) is not None else None,
        "label": status_label(r, p),
        "localization": r.localization[p.id].to_json() if p.id in r.localization else None,
    }


def to_json(r: GateResult) -> dict:
    pv = {v.id: v for v in r.verdict.prompts}
    clocks = {arm: arm_wall_clock(recs) for arm, recs in (("reference", r.reference_records), ("candidate", r.candidate_records))}
    return {
        "schema": REPORT_SCHEMA,
        "name": r.name,
        "created": r.created,
        "verdict": r.verdict.verdict,
        "exit_code": int(r.exit_code),  # overall_exit_code: the tokens' and every section's
        "overall": verdict_heading(r).lower(),  # what that exit code says, in words
        "policy": r.verdict.policy,
        "band": r.verdict.band,
        "reasons": list(r.verdict.reasons),
        "notes": list(r.verdict.notes) + list(r.notes),
        "problems": list(r.problems),
        "summary": r.comparison.summary.to_json() | {"flips": r.flips.to_json()},
        "prompt_set": r.prompt_set,
        "sampling": r.sampling.to_json(),
        "engines": {"reference": r.reference.to_json(), "candidate": r.candidate.to_json()}
        | ({"rescorer": r.rescorer.to_json()} if r.rescorer is not None else {}),
        "runs": r.runs,
        "config": r.config,
        "determinism": r.determinism,
        "rescored_by": r.rescored_by,
        "resumed": r.resumed,
        "history": list(r.history),
        "wall_clock": {k: (v.to_json() if v else None) for k, v in clocks.items()},
        "later": later_totals(r.comparison.prompts, r.later).to_json(),
        "prompts": [_prompt_json(p, pv.get(p.id), r) for p in r.comparison.prompts],
        "features": {name: section_json(r.features[name]) for name in sorted(r.features)},
    }
