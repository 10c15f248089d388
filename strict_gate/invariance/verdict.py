"""The invariance verdict: each variant's runs against the arm's own batch-1 run, by the gate's
comparator, and the verdict of them all under the [invariance] policy.

A prompt that moved is classified from both runs' margins, as the gate classifies a candidate
against its reference: a flip inside the band is a batch-variant near-tie (the reduction order
changed and two almost-equal logits swapped), beyond it a real batch dependence. `distinct
outputs` counts the token sequences one prompt had over the batch-1 run and the variant's
repeats. A variant whose run failed, that could not exercise what it names on the prompt set
(variants.unexercised), or any prompt missing or errored, is incomplete: never a
pass. Under the informational policy (the default) the figures are reported and the exit code
stays the token verdict's.

Under policy near-tie a near-tie flip passes only by the gate's own rule for what follows a
flip (judge/cascade.py): every later token judged on the variant's own prefix (continuation.py),
and a variant that stopped early after it, on an id not known to end a sequence, leaves the
positions it never emitted unjudged (cascade.stop_problem, as a stopped candidate does in the
gate). A later divergence fails the variant, positions left unjudged make it incomplete.

A speculative variant is exact: under a strict or near-tie policy any token it changes fails it,
a flipped near-tie too (verification recomputes the very logits the plain run chose from; a
near-tie that flips says its verify pass sums in another order, worth seeing). Its acceptance
counts ride along; counts that say it drafted nothing, or no counts at all, make it incomplete
(speculation was never shown to run: a plain run is lossless too).

With both arms, moves.py then judges each candidate variant against the reference's own moves
(`Pairing`, each prompt's class; `YARDSTICK`, the reference's verdict where its moves would fail it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from strict_gate.engines.eos import run_stop_ids
from strict_gate.engines.speculative import Acceptance
from strict_gate.errors import ExitCode
from strict_gate.invariance.config import InvariancePolicy, VariantKind
from strict_gate.invariance.continuation import Judged, compared, needs_later
from strict_gate.judge.cascade import Later, stop_problem, unjudged
from strict_gate.judge.compare import UNCOMPARED, PromptComparison, Status
from strict_gate.runs.records import Run

# how far a prompt moved: its worst status over a variant's repeats is the one reported
_RANK = {Status.MATCH: 0, Status.NEAR_TIE: 1, Status.DIVERGENT: 2, Status.LENGTH_MISMATCH: 2,
         Status.NOT_GREEDY: 3, Status.TOKENIZATION_MISMATCH: 3, Status.MISSING: 4, Status.ERROR: 4}
LABELS = {Status.NEAR_TIE: "{}-variant near-tie", Status.DIVERGENT: "{} dependence"}
# what a variant varies, named in its labels ("batch" for the rest): a move under a prefill
# chunk is no batch dependence
CAUSES = {VariantKind.CHUNKED_PREFILL: "prefill-chunk", VariantKind.PREFIX_CACHE: "prefix-cache"}
NAMED = 20  # unjudged near-ties named per variant
EXACT_LABELS = {Status.NEAR_TIE: "speculation flipped a near-tie (a lossless speculator flips none)",
                Status.DIVERGENT: "speculation changed a token",
                Status.NOT_GREEDY: "speculation emitted a token that is not its own argmax"}


class VariantVerdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"
    # a reference variant run beside the candidate's that moved: its moves are what the
    # candidate's are judged against (moves.py), never a failure of the gate
    YARDSTICK = "yardstick"


class Pairing(StrEnum):
    """A prompt of a variant both arms ran: the candidate's move beside the reference's (moves.py)."""

    WITH_REFERENCE = "moves with the reference"
    CANDIDATE_ONLY = "the candidate moves where the reference stays"
    REFERENCE_ONLY = "the reference moves, the candidate does not"
    DIFFERENTLY = "both move differently"


@dataclass(frozen=True)
class Moved:
    """A prompt whose tokens differ from the batch-1 run's in one of the variant's runs."""

    id: str
    run: int  # 1-based: which of the variant's repeats
    status: Status
    position: int | None
    baseline_token: int | None
    variant_token: int | None
    baseline_gap: float | None  # lp_base(base token) - lp_base(variant token)
    variant_gap: float | None
    reason: str
    baseline_tokens: tuple[int, ...] = ()  # both sequences, for the report's agreement strip
    variant_tokens: tuple[int, ...] = ()
    cause: str = "batch"  # what the variant varied (CAUSES)
    exact: bool = False  # of a speculative variant
    # token sequences the prompt had over the batch-1 run and the repeats: 2 when every run that
    # moved moved the same way (the reported run says all of them)
    outputs: int = 2

    @property
    def label(self) -> str:
        if self.exact:
            return EXACT_LABELS.get(self.status, str(self.status))
        return LABELS[self.status].format(self.cause) if self.status in LABELS else str(self.status)

    def to_json(self) -> dict:
        return {"id": self.id, "run": self.run, "status": self.status.value, "label": self.label,
                "position": self.position, "baseline_token": self.baseline_token,
                "variant_token": self.variant_token, "baseline_gap": self.baseline_gap,
                "variant_gap": self.variant_gap, "reason": self.reason,
                "baseline_tokens": list(self.baseline_tokens), "variant_tokens": list(self.variant_tokens),
                "outputs": self.outputs}


@dataclass(frozen=True)
class VariantResult:
    name: str
    arm: str
    runs: tuple[str, ...]  # the variant's run directories
    prompts_total: int
    prompts_exact: int  # equal to the batch-1 run in every repeat
    positions_total: int
    positions_matched: int  # the fewest matched over the repeats, per prompt
    distinct_outputs: int  # most token sequences one prompt had (batch-1 run and repeats); 1: none moved
    prompts_distinct: int  # prompts with more than one
    divergences: tuple[Moved, ...]
    verdict: VariantVerdict
    problems: tuple[str, ...] = ()
    seconds: float | None = None  # wall clock of the variant's runs (engine start excluded)
    baseline_seconds: float | None = None
    exact: bool = False  # a speculative variant: no near-tie allowance
    acceptance: Acceptance | None = None  # its acceptance counts; None: unknown
    # a candidate variant beside the reference's of the same name (moves.py): each prompt that
    # moved on either arm, classified; None: no reference variant ran beside it
    pairs: tuple[tuple[str, Pairing], ...] | None = None
    reference_moves: tuple[Moved, ...] = ()  # the reference variant's moves, for the reports

    def pairing(self, pid: str) -> Pairing | None:
        """The prompt's class beside the reference (None: not paired, or not measured there)."""
        return dict(self.pairs or ()).get(pid)

    def paired_ids(self, kind: Pairing) -> list[str]:
        return [pid for pid, k in self.pairs or () if k == kind]

    @property
    def cost(self) -> float | None:
        """The variant's time over the batch-1 run's (all repeats together)."""
        if self.seconds is None or not self.baseline_seconds:
            return None
        return self.seconds / self.baseline_seconds

    @property
    def near_ties(self) -> int:
        return sum(1 for m in self.divergences if m.status == Status.NEAR_TIE)

    def to_json(self) -> dict:
        return {"name": self.name, "arm": self.arm, "verdict": self.verdict.value, "runs": list(self.runs),
                "prompts_total": self.prompts_total, "prompts_exact": self.prompts_exact,
                "positions_total": self.positions_total, "positions_matched": self.positions_matched,
                "distinct_outputs": self.distinct_outputs, "prompts_distinct": self.prompts_distinct,
                "near_ties": self.near_ties, "divergences": [m.to_json() for m in self.divergences],
                "problems": list(self.problems),
                # unrounded: the reports print them (and the cost) from these, so a reloaded
                # variant (load.py) prints the very digits the live one did
                "seconds": self.seconds, "baseline_seconds": self.baseline_seconds,
                "cost": None if self.cost is None else round(self.cost, 3), "exact": self.exact,
                "acceptance": None if self.acceptance is None else self.acceptance.to_json(),
                "beside_reference": None if self.pairs is None else {k.value: self.paired_ids(k) for k in Pairing}}


@dataclass(frozen=True)
class InvarianceResult:
    policy: InvariancePolicy
    band: float
    config: dict
    variants: tuple[VariantResult, ...]
    baselines: dict  # arm -> its batch-1 run directory
    problems: tuple[str, ...] = ()

    @property
    def verdict(self) -> VariantVerdict:
        kinds = {v.verdict for v in self.variants}
        if self.problems or not self.variants or VariantVerdict.INCOMPLETE in kinds:
            return VariantVerdict.INCOMPLETE
        return VariantVerdict.FAIL if VariantVerdict.FAIL in kinds else VariantVerdict.PASS

    @property
    def exit_code(self) -> int:
        """0 pass or informational, 5 a variant moved, 3 a variant not run (never a pass)."""
        if self.policy == InvariancePolicy.INFORMATIONAL:
            return ExitCode.PASS
        return {VariantVerdict.PASS: ExitCode.PASS, VariantVerdict.FAIL: ExitCode.NOT_INVARIANT}.get(
            self.verdict, ExitCode.ENGINE_FAILURE)

    @property
    def section_verdict(self) -> str:
        return str(self.verdict)

    @property
    def lead(self) -> VariantVerdict:
        """What the headline leads with: a measured move before anything that could not be run
        (the verdict, and the exit code, stay incomplete then:
        docs/reading-a-report.md, "Exit codes and their precedence")."""
        return VariantVerdict.FAIL if any(v.verdict == VariantVerdict.FAIL for v in self.variants) else self.verdict

    def _names(self, verdict: VariantVerdict) -> str:
        one_arm = len({x.arm for x in self.variants}) == 1
        named = [v.name if one_arm else f"{v.arm}:{v.name}" for v in self.variants if v.verdict == verdict]
        return f" ({', '.join(named)})" if named else ""

    @property
    def verdict_line(self) -> str:
        """The move first, then what could not be run: "NOT INVARIANT (batch-4); INCOMPLETE too
        (chunked_prefill-2): exit 3, policy strict"."""
        note = " (informational: the exit code is the token verdict's)" \
            if self.policy == InvariancePolicy.INFORMATIONAL else ""
        moved, unrun = self._names(VariantVerdict.FAIL), self._names(VariantVerdict.INCOMPLETE)
        if self.verdict == VariantVerdict.INCOMPLETE and moved:
            code = "" if note else f": exit {int(self.exit_code)}"
            return f"NOT INVARIANT{moved}; INCOMPLETE too{unrun}{code}, policy {self.policy.value}{note}"
        head = {VariantVerdict.PASS: "INVARIANT", VariantVerdict.FAIL: "NOT INVARIANT",
                VariantVerdict.INCOMPLETE: "INVARIANCE INCOMPLETE"}[self.verdict]
        return f"{head}{moved or unrun}, policy {self.policy.value}{note}"

    def to_json(self) -> dict:
        return {"verdict": self.verdict.value, "policy": self.policy.value, "band": self.band,
                "exit_code": int(self.exit_code), "config": self.config, "baselines": self.baselines,
                "problems": list(self.problems), "variants": [v.to_json() for v in self.variants]}


def _tokens(run: Run, pid: str) -> tuple[int, ...]:
    rec = run.records.get(pid)
    return () if rec is None or rec.error is not None else tuple(rec.token_ids)


def _moved(p: PromptComparison, k: int, baseline: Run, runs: Sequence[Run], cause: str, exact: bool,
           outputs: int) -> Moved:
    d = p.first_divergence
    return Moved(p.id, k, p.status, d.position if d else None, d.reference_token if d else None,
                 d.candidate_token if d else None, d.reference_gap if d else None,
                 d.candidate_gap if d else None, d.reason if d else p.detail,
                 _tokens(baseline, p.id), _tokens(runs[k - 1], p.id), cause, exact, outputs)


def fails(status: Status, policy: InvariancePolicy, exact: bool) -> bool:
    """Whether a prompt of this status fails a variant under the policy."""
    near_ok = policy == InvariancePolicy.NEAR_TIE and not exact
    allowed = (Status.MATCH, Status.NEAR_TIE) if near_ok else (Status.MATCH,)
    return status not in allowed


def _acceptance_problem(name: str, acc: Acceptance | None) -> str | None:
    """Counts that say nothing was drafted, or no counts at all: speculation was never shown to
    run, so nothing is proven about it."""
    if acc is None or (acc.replies == 0 and acc.drafts is None):
        return (f"{name}: no reply carried acceptance counts and the engine keeps none: whether it speculated at "
                "all is unknown (a plain run is lossless too), so the run proves nothing about speculation")
    if acc.drafted > 0:
        return None
    return (f"{name}: the engine drafted no token over the whole run (its counts say drafted 0): speculation "
            "was not exercised, so the run proves nothing about it")


def _after_flip(p: PromptComparison, j: Judged, policy: InvariancePolicy, exact: bool, where: str,
                stop: str | None) -> tuple[PromptComparison, str | None]:
    """A near-tie that the policy would pass, judged by the gate's own rule for what follows a
    flip (judge/cascade.py): divergent when a later position is (its reason says where),
    unverified (the second value: why) when a position is unjudged, not re-scored or never
    emitted because the variant stopped early (`stop`, cascade.stop_problem), else the near-tie
    with its later positions counted in its reason."""
    if policy != InvariancePolicy.NEAR_TIE or exact or p.status != Status.NEAR_TIE:
        return p, None
    d = p.first_divergence
    assert d is not None  # a near-tie has its divergence
    c = (j.later.get(p.id) or unjudged(d.position, p.candidate_length, j.unjudged)) if needs_later(p) else None
    if c is not None and c.outcome == Later.DIVERGENT:
        x = c.divergent[0]
        why = (f"divergent after a near-tie: later position {x.position}, token {x.token} vs the batch-1 argmax "
               f"{x.reference_argmax}: {x.reason} (near-tie at position {d.position}; {c.counts()})")
        return replace(p, status=Status.DIVERGENT, first_divergence=replace(d, reason=why)), None
    head = f"{where}: {p.id}: a near-tie at position {d.position}"
    if c is not None and c.outcome == Later.UNVERIFIED:
        return p, f"{head}; {c.unverified}"
    if stop is not None:
        return p, f"{head}; {stop}"
    return (p if c is None else replace(p, first_divergence=replace(d, reason=f"{d.reason}; {c.summary()}"))), None


def _stop(run: Run, pid: str, eos: frozenset[int] | None) -> str | None:
    """Why the variant's early stop on this prompt leaves positions unjudged (cascade.stop_problem,
    the gate's own), or None."""
    rec = run.records.get(pid)
    if rec is None or rec.error is not None:
        return None
    return stop_problem(rec.token_ids, rec.finish_reason, run.manifest.sampling.max_tokens, eos,
                        who="the variant", other="the batch-1 run")


def judge_variant(name: str, arm: str, baseline: Run, runs: Sequence[Run], *, policy: InvariancePolicy,
                  band: float, problems: Sequence[str] = (), seconds: float | None = None,
                  baseline_seconds: float | None = None, cause: str = "batch", exact: bool = False,
                  acceptance: Acceptance | None = None, judged: Sequence[Judged] | None = None) -> VariantResult:
    """Every run of the variant against the batch-1 run, prompt by prompt, its worst run reported.
    `judged`: each run's comparison with its near-ties' later positions (continuation.py); without
    it the runs are compared here, and a near-tie with tokens after it is unjudged."""
    ids = list(baseline.manifest.prompt_ids or baseline.records)
    judged = judged if judged is not None else [compared(baseline, r, band) for r in runs]
    eos = run_stop_ids(baseline, *runs)
    worst: dict[str, tuple[PromptComparison, int]] = {}
    matched: dict[str, int] = {}
    width: dict[str, int] = {}
    unverified: list[str] = []
    for k, j in enumerate(judged, start=1):
        for p in j.comparison.prompts:
            p, why = _after_flip(p, j, policy, exact, f"{name} run {k}", _stop(runs[k - 1], p.id, eos))
            unverified += [why] if why else []
            if p.id not in worst or _RANK[p.status] > _RANK[worst[p.id][0].status]:
                worst[p.id] = (p, k)
            matched[p.id] = min(matched.get(p.id, p.matched_positions), p.matched_positions)
            width[p.id] = max(width.get(p.id, 0), p.positions)
    distinct = {pid: len({tuple(r.records[pid].token_ids) for r in (baseline, *runs)
                          if pid in r.records and r.records[pid].error is None}) for pid in ids}
    problems = list(problems)  # the runner's: an engine failure, said once
    for label, run in (("batch-1 run", baseline), *((f"run {k}", r) for k, r in enumerate(runs, start=1))):
        if not run.complete and not any(run.manifest.error and run.manifest.error in p for p in problems):
            problems.append(f"{name} {label} is {run.manifest.status}: {run.manifest.error or 'not finished'}")
    idle = _acceptance_problem(name, acceptance) if exact and not problems else None
    problems += [idle] if idle else []
    statuses = [p.status for p, _ in worst.values()]
    if problems or not runs or any(s in UNCOMPARED for s in statuses):
        verdict = VariantVerdict.INCOMPLETE
    elif any(fails(s, policy, exact) for s in statuses):
        verdict = VariantVerdict.FAIL
    else:
        verdict = VariantVerdict.INCOMPLETE if unverified else VariantVerdict.PASS
    return VariantResult(
        name=name, arm=arm, runs=tuple(r.path for r in runs), prompts_total=len(ids),
        prompts_exact=sum(1 for s in statuses if s == Status.MATCH) if runs else 0,
        positions_total=sum(width.values()), positions_matched=sum(matched.values()),
        distinct_outputs=max(distinct.values(), default=0),
        prompts_distinct=sum(1 for n in distinct.values() if n > 1),
        divergences=tuple(_moved(p, k, baseline, runs, cause, exact, distinct.get(p.id, 0)) for p, k in worst.values()
                          if p.status != Status.MATCH),
        verdict=verdict, problems=(*problems, *unverified[:NAMED]), seconds=seconds,
        baseline_seconds=baseline_seconds, exact=exact, acceptance=acceptance,
    )


def not_run(name: str, arm: str, why: str) -> VariantResult:
    """A variant that could not run at all (its engine never started, its baseline failed)."""
    return VariantResult(name, arm, (), 0, 0, 0, 0, 0, 0, (), VariantVerdict.INCOMPLETE, (why,))
