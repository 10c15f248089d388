"""One arm of a localisation: the targets it dumps, the settings, and its audited dumps.

Each arm's dump is checked to choose, at the divergence, the token that arm generated
(`reproduce`); the mode says which path is compared: `auto` (prefill, and the decode path where
the prefill dump does not reproduce and the engine can dump along it), `prefill`, `decode`, or
`both` (each path localised on its own, reported side by side: localize/run.py). A decode dump
whose rows before `decode_from` (a prefill, by the protocol) are not its own prefill dump's did
not run the path asked, and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from strict_gate.engines.base import DumpRequest, Engine
from strict_gate.errors import EngineError, InputError
from strict_gate.judge.cascade import Cascade, LaterPosition
from strict_gate.judge.compare import Comparison, Status
from strict_gate.judge.localization import Reproduction
from strict_gate.localize.capture import Audited, capture, read_back
from strict_gate.localize.compare import default_tolerance
from strict_gate.localize.points import DEFAULT_POSITIONS, OPS_DEPTH
from strict_gate.localize.reproduce import decode_mismatch, reproduction
from strict_gate.runs.records import Record


class DumpMode(StrEnum):
    AUTO = "auto"  # prefill; the decode path where prefill does not reproduce and the engine can
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"  # each path localised on its own, side by side


def parse_mode(text: str, *, where: str = "--mode") -> DumpMode:
    try:
        return DumpMode(text)
    except ValueError:
        raise InputError(f"{where}: {text!r} is not a dump mode; one of "
                         f"{', '.join(m.value for m in DumpMode)}") from None


@dataclass(frozen=True)
class Target:
    """One prompt to localise: the ids both arms run, the positions kept, and what each arm
    generated at the divergence (None: that arm's sequence ended there)."""

    prompt_id: str
    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    tokens: tuple[tuple[str, int | None], ...] = ()  # (("reference", r), ("candidate", c))
    prompt_len: int | None = None  # where the decode path starts

    def token(self, role: str) -> int | None:
        return dict(self.tokens).get(role)


@dataclass(frozen=True)
class Settings:
    points: tuple[str, ...] | None = None  # None: every point the engines give
    positions: int = DEFAULT_POSITIONS
    tolerance: float | None = None  # None: by the arms' dtypes (compare.TOLERANCES)
    graft: bool = True  # where the candidate can (layers; ops with graft_ops)
    keep: bool = False
    narrow: bool = True  # a second pass at the ops inside the first layer beyond tolerance
    mode: DumpMode = DumpMode.AUTO

    @property
    def every_op(self) -> bool:
        return self.points == (OPS_DEPTH,)

    @property
    def first_pass(self) -> tuple[str, ...] | None:
        return None if self.every_op else self.points


def target(pid: str, rec: Record, divergence: int, n: int, tokens: tuple[int | None, int | None] = (None, None)
           ) -> Target:
    """The ids up to `divergence` along `rec`'s tokens (the reference's for a first divergence,
    the candidate's own prefix for a later one) and the positions kept before it."""
    ids = tuple(rec.prompt_token_ids) + tuple(rec.token_ids[: divergence + 1])
    at = len(rec.prompt_token_ids) + divergence - 1  # its logits chose token `divergence`
    return Target(pid, ids, tuple(range(max(0, at - n + 1), at + 1)),
                  (("reference", tokens[0]), ("candidate", tokens[1])), len(rec.prompt_token_ids))


def later_divergence(status: Status, cascade: Cascade | None) -> LaterPosition | None:
    """A near-tie's first later divergent position (judge/cascade.py), or None: what fails such a
    prompt, so what is localised and named, never the near-tie before it."""
    if status != Status.NEAR_TIE or cascade is None or not cascade.divergent:
        return None
    return cascade.divergent[0]


def targets(comparison: Comparison, ref_records: Mapping[str, Record], *, n: int, statuses: Sequence[Status],
            only: str | None = None, later: Mapping[str, Cascade] | None = None,
            cand_records: Mapping[str, Record] | None = None) -> list[Target]:
    """Each prompt to localise: a divergent first flip on the reference's prefix; a near-tie that
    diverges later (`later`, the gate's cascades) at that later position, on the candidate's own
    prefix, whatever `statuses` asks (the prompt fails there: it is divergent)."""
    out = []
    for p in comparison.prompts:
        d = p.first_divergence
        if d is None or (only is not None and p.id != only):
            continue
        lp = later_divergence(p.status, (later or {}).get(p.id))
        if lp is not None and cand_records is not None and p.id in cand_records:
            out.append(target(p.id, cand_records[p.id], lp.position, n, (lp.reference_argmax, lp.token)))
        elif p.status in statuses:
            out.append(target(p.id, ref_records[p.id], d.position, n, (d.reference_token, d.candidate_token)))
    return out


def engine_name(engine: Engine) -> str:
    return f"{engine.kind} {engine.info().model}"


def engine_dtype(engine: Engine) -> str | None:
    d = engine.speed_settings().get("dtype")
    return str(d) if d else None


class Arm:
    """One arm's dumps for every target, one directory per request, each read back exactly as
    the audit saw it; per target, whether the dump compared chose this arm's token."""

    def __init__(self, engine: Engine, work: Path, role: str, settings: Settings):
        self.engine, self.root, self.role, self.settings = engine, work / role, role, settings
        self.files: dict[tuple[str, str], Audited] = {}
        self.errors: dict[str, str] = {}
        self.failed: dict[tuple[str, str], str] = {}
        self.checks: dict[str, Reproduction] = {}
        self.requests = 0

    def dump(self, t: Target, what: str, points, positions, graft: Path | None = None,
             decode_from: int | None = None, *, fatal: bool = True) -> Audited | None:
        """One audited dump; a failure fails the prompt's localisation (`fatal`) or is kept in
        `failed` for the pass that asked."""
        if t.prompt_id in self.errors:
            return None
        self.requests += 1
        directory = self.root / f"{self.requests:04d}-{what}"
        request = DumpRequest(t.token_ids, points, positions, directory, graft, decode_from)
        try:
            self.files[(t.prompt_id, what)] = found = capture(self.engine, request)
        except EngineError as e:
            if fatal:
                self.errors[t.prompt_id] = str(e)
            else:
                self.failed[(t.prompt_id, what)] = str(e)
            return None
        return found

    def decoded(self, pid: str) -> bool:
        return (pid, "decode") in self.files

    def compared(self, t: Target) -> None:
        """The dump to compare, along the path the mode asks (module docstring)."""
        mode, points, token = self.settings.mode, self.settings.first_pass, t.token(self.role)
        found = self.dump(t, "points", points, t.positions)
        if found is None:
            return
        check = None if token is None else reproduction(self.engine, self.role, t, token, found.tensors, "prefill")
        wants_decode = mode is DumpMode.DECODE or (
            mode is DumpMode.AUTO and check is not None and check.reproduced is False and self.engine.can_dump_decode)
        if wants_decode and not (self.engine.can_dump_decode and t.prompt_len):
            self.errors[t.prompt_id] = (f"mode decode: the {self.role} ({self.engine.kind}) cannot dump along its "
                                        "decode path (no dump_decode)" if t.prompt_len else
                                        "mode decode: the target has no prompt length to decode from")
            return
        if wants_decode:
            decoded = self.dump(t, "decode", points, t.positions, decode_from=t.prompt_len)
            if decoded is None:
                return
            if (why := self._mismatch(t, found, decoded)) is not None:
                self.errors[t.prompt_id] = why
                return
            self.files[(t.prompt_id, "points")] = decoded
            check = None if token is None else reproduction(self.engine, self.role, t, token, decoded.tensors,
                                                            "decode")
        if check is not None:
            self.checks[t.prompt_id] = check

    def decode_instead(self, t: Target) -> None:
        """The dump along the decode path replaces this arm's prefill dump (and is checked again),
        where the engine can: the other arm's compared dump took its decode path. A failure keeps
        the prefill dump."""
        prefill, token = self.files.get((t.prompt_id, "points")), t.token(self.role)
        if prefill is None or self.decoded(t.prompt_id) or not (self.engine.can_dump_decode and t.prompt_len):
            return
        decoded = self.dump(t, "decode", self.settings.first_pass, t.positions, decode_from=t.prompt_len, fatal=False)
        if decoded is None:
            return
        if (why := self._mismatch(t, prefill, decoded)) is not None:
            self.errors[t.prompt_id] = why
            return
        self.files[(t.prompt_id, "points")] = decoded
        if token is not None:
            self.checks[t.prompt_id] = reproduction(self.engine, self.role, t, token, decoded.tensors, "decode")

    def _mismatch(self, t: Target, prefill: Audited, decoded: Audited) -> str | None:
        dtype = engine_dtype(self.engine)
        tol = self.settings.tolerance or default_tolerance(dtype, dtype)
        why = decode_mismatch(prefill.tensors, decoded.tensors, t.positions, t.prompt_len or 0, tol)
        return None if why is None else f"the {self.role}'s ({engine_name(self.engine)}) decode dump {why}"

    def load(self, pid: str, what: str) -> dict:
        return read_back(self.files[(pid, what)])
