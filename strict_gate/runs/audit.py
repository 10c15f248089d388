"""The run audit: a run's claims are checked, never trusted, before any comparison.

The same rules judge runs read from disk and runs made live. A stored run that breaks
one is bad input (exit 2, the message names the rule, the file and the line); a live
engine that breaks one is an engine failure (exit 3). Greedy is judged per prompt
instead: a chosen token below the arm's own top-1 by more than the greedy tolerance
gives the prompt the status `not_greedy`, which fails every policy.

Rules (each message starts with "rule NAME"):
  steps-match-tokens  one top-k step per generated token
  finite-logprobs     every logprob is a finite number <= 0 (LOGPROB_EPS of float noise allowed)
  chosen-listed       each step lists the chosen token
  unique-ids          no token id twice in a step
  sorted              a step's pairs go by logprob descending, ties by token id ascending
  token-range         token ids are >= 0 and below the vocabulary size where it is known
  finish-reason       "stop" or "length"; never more than max_tokens tokens; "length" only
                      with exactly max_tokens tokens
  samples             samples[0] equals token_ids; no sample longer than max_tokens
  temperature         greedy sampling only: the manifest's temperature is 0
  prompt-set          the manifest names its prompt set's sha256
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from pathlib import Path

import numpy as np

from strict_gate.errors import InputError
from strict_gate.runs.records import FINISH_REASONS, EngineInfo, Manifest, Record, Run, TopSteps

LOGPROB_EPS = 1e-6  # log-softmax in float32 may round the top logprob a hair above 0
DEFAULT_GREEDY_TOLERANCE = 1e-3  # nats; a bf16 logprob near -4 moves in steps of 0.03125
MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class StepTable:
    """Top-k steps as padded matrices: ids (S, W) padded with -1 - column (distinct
    negatives, so padding never looks like a duplicate), logprobs padded with -inf,
    and the real width of each row."""

    ids: np.ndarray
    lps: np.ndarray
    width: np.ndarray

    @classmethod
    def from_flat(cls, ids: np.ndarray, lps: np.ndarray, width: np.ndarray) -> StepTable:
        width = np.asarray(width, dtype=np.int64)
        s = len(width)
        w = int(width.max()) if s else 0
        if s and (width == w).all():
            return cls(ids.reshape(s, w), lps.reshape(s, w), width)
        pad_ids = np.broadcast_to(-1 - np.arange(w, dtype=np.int64), (s, w)).copy()
        pad_lps = np.full((s, w), -np.inf)
        row = np.repeat(np.arange(s), width)
        starts = np.cumsum(width) - width
        col = np.arange(len(ids)) - np.repeat(starts, width)
        pad_ids[row, col] = ids
        pad_lps[row, col] = lps
        return cls(pad_ids, pad_lps, width)

    @classmethod
    def from_steps(cls, steps: Sequence[Sequence[tuple[int, float]]]) -> StepTable:
        if isinstance(steps, TopSteps):
            return cls(steps.ids, steps.lps, np.asarray(steps.width))
        # C-level iterators only: a Python generator per pair made this a quarter of reading a run
        pairs = list(chain.from_iterable(steps))
        n = len(pairs)
        if n and set(map(len, pairs)) != {2}:
            raise ValueError("a top-k pair is not [token_id, logprob]")
        width = np.fromiter(map(len, steps), dtype=np.int64, count=len(steps))
        ids = np.fromiter(map(itemgetter(0), pairs), dtype=np.int64, count=n)
        lps = np.fromiter(map(itemgetter(1), pairs), dtype=np.float64, count=n)
        return cls.from_flat(ids, lps, width)

    def chosen_mask(self, chosen: np.ndarray) -> np.ndarray:
        return self.ids == chosen[:, None]


def _first(mask: np.typing.ArrayLike) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def audit_steps(table: StepTable, chosen: np.ndarray, vocab_size: int | None) -> tuple[int, str] | None:
    """The step rules over every step at once; the first violation as (step index, message)."""
    ids, lps, width = table.ids, table.lps, table.width
    if not len(width):
        return None
    w = ids.shape[1]
    valid = np.arange(w) < width[:, None]
    checks = [
        ("finite-logprobs", valid & ~(np.isfinite(lps) & (lps <= LOGPROB_EPS)), "a logprob is not finite or is > 0"),
        ("token-range", valid & ((ids < 0) | (ids > (vocab_size - 1 if vocab_size else MAX_TOKEN_ID))),
         "a top-k token id is negative or beyond the vocabulary" + (f" ({vocab_size})" if vocab_size else "")),
    ]
    for rule, bad, what in checks:
        s = _first(bad.any(axis=1))
        if s is not None:
            j = int(np.flatnonzero(bad[s])[0])
            return s, f"rule {rule}: step {{pos}} pair [{ids[s, j]}, {lps[s, j]!r}]: {what}"
    listed = table.chosen_mask(chosen).any(axis=1)
    s = _first(~listed)
    if s is not None:
        return s, f"rule chosen-listed: step {{pos}} does not list its chosen token {int(chosen[s])}"
    srt = np.sort(ids, axis=1)
    s = _first((srt[:, 1:] == srt[:, :-1]).any(axis=1))
    if s is not None:
        return s, "rule unique-ids: step {pos} lists a token id twice"
    if w > 1:
        nxt = valid[:, 1:]
        drop = lps[:, 1:] > lps[:, :-1]
        tie = (lps[:, 1:] == lps[:, :-1]) & (ids[:, 1:] < ids[:, :-1])
        s = _first((nxt & (drop | tie)).any(axis=1))
        if s is not None:
            return s, "rule sorted: step {pos} is not sorted by logprob descending (ties by token id ascending)"
    return None


def _ids_out_of_range(ids: Sequence[int], vocab_size: int | None) -> bool:
    top = vocab_size - 1 if vocab_size else MAX_TOKEN_ID
    try:
        arr = np.asarray(ids, dtype=np.int64)
    except OverflowError:
        return True
    return bool(len(arr)) and bool(((arr < 0) | (arr > top)).any())


def _text_only_rule(r, text, has_top: bool, max_tokens: int | None) -> str | None:
    """A text-only record (a server that answers text): no logprobs, no samples, and its finish
    reason against the server's own count of generated tokens."""
    if has_top or r.samples is not None:
        return 'rule text-only: a "text_only" record carries no "top_logprobs" and no "samples" (none were returned)'
    n = text.usage_completion_tokens
    if max_tokens is None or n is None:
        return None
    if n > max_tokens:
        return f"rule finish-reason: the server generated {n} tokens (usage) but max_tokens is {max_tokens}"
    if r.finish_reason == "length" and n != max_tokens:
        return (f'rule finish-reason: "length" after {n} generated tokens (usage); "length" means exactly '
                f"max_tokens ({max_tokens})")
    return None


def audit_records(
    raws: Sequence,
    table: StepTable | None,
    has_top: np.ndarray,
    *,
    max_tokens: int | None,
    vocab_size: int | None,
) -> tuple[int, str] | None:
    """Every rule over a run's records (objects with id, prompt_token_ids, token_ids,
    finish_reason, samples, error); the first violation as (record index, message)."""
    ntok = np.fromiter((len(r.token_ids) for r in raws), dtype=np.int64, count=len(raws))
    for i, r in enumerate(raws):
        where = f"record {r.id!r}: "
        if any(_ids_out_of_range(ids, vocab_size) for ids in (r.prompt_token_ids, r.token_ids, *(r.samples or ()))):
            limit = f"below the vocabulary size {vocab_size}" if vocab_size else f"in 0..{MAX_TOKEN_ID}"
            return i, f"rule token-range: {where}token ids must be {limit}"
        if r.error is not None:
            continue
        if r.finish_reason not in FINISH_REASONS:
            return i, f'rule finish-reason: {where}"finish_reason" must be one of {FINISH_REASONS}, got {r.finish_reason!r}'
        text = getattr(r, "text_only", None)
        if text is not None:  # its ids are a re-tokenization: the server's own count is the rule's
            broken = _text_only_rule(r, text, bool(has_top[i]), max_tokens)
            if broken is not None:
                return i, where + broken
            continue
        if max_tokens is not None:
            n = int(ntok[i])
            if n > max_tokens:
                return i, f"rule finish-reason: {where}{n} tokens but max_tokens is {max_tokens}"
            if r.finish_reason == "length" and n != max_tokens:
                return i, f'rule finish-reason: {where}"length" with {n} tokens; "length" means exactly max_tokens ({max_tokens})'
        if r.samples is not None:
            if not r.samples:
                return i, f'rule samples: {where}"samples" must be a non-empty list of token-id lists'
            if tuple(r.samples[0]) != tuple(r.token_ids):
                return i, f'rule samples: {where}"samples"[0] must equal "token_ids" (the first run is the golden)'
            if max_tokens is not None and any(len(s) > max_tokens for s in r.samples):
                return i, f"rule samples: {where}a sample is longer than max_tokens ({max_tokens})"
    if table is None or not has_top.any():
        return None
    chosen = np.concatenate(
        [np.asarray(r.token_ids, dtype=np.int64) for r, h in zip(raws, has_top) if h] or [np.zeros(0, np.int64)]
    )
    found = audit_steps(table, chosen, vocab_size)
    if found is None:
        return None
    step, message = found
    owners = np.flatnonzero(has_top)
    ends = np.cumsum(ntok[owners])
    k = int(np.searchsorted(ends, step, side="right"))
    index = int(owners[k])
    pos = step - (int(ends[k - 1]) if k else 0)
    return index, f"record {raws[index].id!r}: " + message.format(pos=pos)


def audit_record(rec: Record, max_tokens: int, vocab_size: int | None = None) -> str | None:
    """The same rules for one live record; the violation's message or None."""
    if rec.top_logprobs is not None and len(rec.top_logprobs) != len(rec.token_ids):
        return (f"rule steps-match-tokens: record {rec.id!r}: {len(rec.top_logprobs)} top-k steps for "
                f"{len(rec.token_ids)} tokens")
    try:
        table = None if rec.top_logprobs is None else StepTable.from_steps(rec.top_logprobs)
    except OverflowError:
        return f"rule token-range: record {rec.id!r}: a top-k token id does not fit in 64 bits"
    found = audit_records([rec], table, np.array([rec.top_logprobs is not None]), max_tokens=max_tokens,
                          vocab_size=vocab_size)
    return None if found is None else found[1]


def audit_manifest(manifest: Manifest, path: str) -> None:
    """A run's own claims about how it was made."""
    if manifest.sampling.temperature != 0:
        raise InputError(
            f"rule temperature: the run was sampled at temperature {manifest.sampling.temperature!r}; "
            "a gate compares greedy runs only (temperature 0)",
            path=path,
        )
    sha = manifest.prompt_set.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64:
        raise InputError(
            f"rule prompt-set: the manifest's prompt_set has no sha256 (got {sha!r}); a run of unknown prompts "
            "cannot be compared",
            path=path,
        )
    ids = manifest.prompt_set.get("ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise InputError('"prompt_set.ids" must be a list of prompt id strings', path=path)


@dataclass(frozen=True)
class GreedyViolation:
    """Where an arm chose a token below its own top-1 by more than the tolerance."""

    position: int
    chosen: int
    top1: int
    gap: float  # lp(top-1) - lp(chosen), > tolerance


def greedy_violation(rec: Record, tolerance: float) -> GreedyViolation | None:
    """The first step whose chosen token is below the arm's own top-1 by more than
    `tolerance` nats (an exact tie is greedy); None for a greedy record or no logprobs."""
    if rec.top_logprobs is None or not rec.token_ids or rec.error is not None:
        return None
    table = StepTable.from_steps(rec.top_logprobs)
    chosen = np.asarray(rec.token_ids, dtype=np.int64)
    mask = table.chosen_mask(chosen)
    chosen_lp = np.where(mask, table.lps, -np.inf).max(axis=1)
    top_lp = table.lps.max(axis=1)
    gap = top_lp - chosen_lp
    s = _first(~(gap <= tolerance))  # NaN or -inf chosen logprob counts as a violation
    if s is None:
        return None
    top1 = int(table.ids[s, int(np.argmax(table.lps[s]))])
    return GreedyViolation(s, int(chosen[s]), top1, float(gap[s]))


def check_comparable(reference: Run, candidate: Run) -> None:
    """Two runs are comparable only with the same prompt set (hash present), max_tokens and
    top_logprobs; otherwise bad input naming the field."""
    rm, cm = reference.manifest, candidate.manifest
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
    for label, run in (("reference", reference), ("candidate", candidate)):
        if not isinstance(run.manifest.prompt_set.get("sha256"), str):
            raise InputError(f"the {label} run records no prompt set sha256", path=run.path)


def vocab_size(engine: EngineInfo) -> int | None:
    """The vocabulary size where the run's model or tokenizer is on this machine, else None
    (then token ids are only checked to be in 0..2**31-1)."""
    from strict_gate.core.model_files import find_tokenizer_json

    for ref in (engine.tokenizer, engine.model):
        if not ref:
            continue
        tok = find_tokenizer_json(ref, Path.cwd())
        if tok is None:
            continue
        config = tok.parent / "config.json"
        try:
            if config.is_file():
                v = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
                if isinstance(v, int) and v > 0:
                    return v
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(tok)).get_vocab_size(with_added_tokens=True)
        except Exception:  # an unreadable tokenizer only means the vocabulary is unknown
            continue
    return None
