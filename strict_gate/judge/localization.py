"""A localisation's figures, as every report format reads them (strict_gate/localize makes them).

Per prompt: the error of each canonical point along the depth (max |Δ|, rel_diff, cosine, the
reference's scale), the first point whose rel_diff is beyond tolerance, and, where both arms
could graft, each layer's error alone with the reference's input fed in, and inside the first
layer beyond, each op's: wrong on its own, or following its input (docs/localize.md). With
`--mode both`, the decode path's localisation rides along the prefill one (`decode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PointKind(StrEnum):
    """The kinds of canonical point (docs/localize.md); one line per kind in the report's curve."""

    EMBED = "embed"
    ATTN = "attn"
    MLP = "mlp"
    LAYER = "layer"
    NORM = "norm"
    LOGITS = "logits"
    OP = "op"  # a point inside a layer (layers.N.attn.q_proj, ...)


def kind_of(name: str) -> PointKind:
    if name.startswith("layers."):
        parts = name.split(".")
        if len(parts) == 2:
            return PointKind.LAYER
        return PointKind(parts[2]) if len(parts) == 3 and parts[2] in ("attn", "mlp") else PointKind.OP
    return PointKind(name)


class Mode(StrEnum):
    ACCUMULATED = "accumulated"  # each arm's own forward pass: error carried from below
    GRAFTED = "grafted"  # the candidate's layers fed the reference's inputs: each layer's own error


class Alone(StrEnum):
    """An op fed the reference's inputs (grafted at ops): does it still differ?"""

    WRONG = "wrong alone"  # beyond tolerance on the reference's inputs: the op itself computes differently
    FOLLOWS = "follows when fed the reference's input: drift from earlier"  # beyond only on its own inputs


@dataclass(frozen=True)
class PointDiff:
    name: str
    max_abs: float | None = None
    rel_diff: float | None = None  # 1 - 2Σxy/(Σx²+Σy²)
    cosine: float | None = None
    scale: float | None = None  # the reference's RMS at this point
    beyond: bool = False
    note: str | None = None  # why the point is not comparable (absent on one arm, shapes differ)

    def to_json(self) -> dict:
        return {"name": self.name, "max_abs": self.max_abs, "rel_diff": self.rel_diff, "cosine": self.cosine,
                "scale": self.scale, "beyond": self.beyond, "note": self.note}

@dataclass(frozen=True)
class Reproduction:
    """Whether one arm's dump chose, at the divergence, the token that arm generated there: a
    dump that did not took another path than the one that produced the divergence."""

    arm: str  # "reference" | "candidate"
    token: int  # the token the arm generated at the divergence
    chosen: int | None  # the dump's argmax there (None: not checked)
    source: str  # "logits" (the dump's own), "score" (a score of the same prefix) or why unchecked
    path: str = "prefill"  # the dump's path: "prefill" | "decode"

    @property
    def reproduced(self) -> bool | None:
        return None if self.chosen is None else self.chosen == self.token

    def words(self) -> str:
        if self.chosen is None:
            return f"the {self.arm}'s dump was not checked against its token ({self.source})"
        if self.reproduced:
            return f"the {self.arm}'s {self.path} dump chooses its token {self.token} ({self.source})"
        return (f"the {self.arm}'s {self.path} dump picks {self.chosen} where it generated {self.token} "
                f"({self.source}): its generated token came from another path than the dump's "
                f"({'decode, batching or cache' if self.path == 'prefill' else 'batching or cache'})")

    def to_json(self) -> dict:
        return {"arm": self.arm, "token": self.token, "chosen": self.chosen, "source": self.source,
                "path": self.path, "reproduced": self.reproduced}

@dataclass(frozen=True)
class Localization:
    prompt_id: str
    positions: tuple[int, ...]  # indices into the ids both arms ran
    points: tuple[PointDiff, ...]  # accumulated, in depth order
    first_beyond: str | None
    tolerance: float
    reference_engine: str
    candidate_engine: str
    grafted: tuple[PointDiff, ...] = ()  # empty: an arm cannot graft
    reference_note: str | None = None  # why this engine is the activation reference, when not the reference arm
    error: str | None = None  # the localisation failed for this prompt (an arm's dump, in words)
    kept: str | None = None  # where the tensors were kept (--keep)
    reproduction: tuple[Reproduction, ...] = ()  # per arm: did its dump choose the token it generated
    ops: tuple[PointDiff, ...] = ()  # the narrowing pass: the points inside the first-beyond layer
    ops_grafted: tuple[PointDiff, ...] = ()  # the same ops, each fed the reference's inputs (graft_ops)
    alone: tuple[tuple[str, Alone], ...] = ()  # per judged op beyond on either curve: its verdict
    op_graft_note: str | None = None  # why the ops were not grafted, or why the graft was refused
    op_graft_refused: bool = False  # the candidate's op graft broke a check (the note says which)
    dump_mode: str = "auto"  # --mode: auto | prefill | decode | both
    decode: Localization | None = None  # --mode both: the decode path's localisation (this is prefill's)

    def verdict(self, op: str | None) -> Alone | None:
        return dict(self.alone).get(op or "")

    def alone_words(self, op: str | None) -> str:
        """"(grafted: wrong alone)" after an op's name, or why it has no verdict; "" without op graft."""
        if op is None or not (self.ops_grafted or self.op_graft_note):
            return ""
        v = self.verdict(op)
        if v is not None:
            return f" (grafted: {v})"
        if self.ops_grafted:
            return " (grafted: not judged: its inputs are not points both arms give)"
        return f" ({self.op_graft_note})"

    @property
    def first_beyond_op(self) -> str | None:
        """The first op beyond tolerance inside the layer the narrowing pass looked into."""
        return next((p.name for p in self.ops if p.beyond), None)

    @property
    def not_reproduced(self) -> tuple[Reproduction, ...]:
        return tuple(r for r in self.reproduction if r.reproduced is False)

    @property
    def unchecked(self) -> tuple[Reproduction, ...]:
        return tuple(r for r in self.reproduction if r.reproduced is None)

    @property
    def not_compared(self) -> tuple[str, ...]:
        """Points one arm did not give, before the first beyond (all of them when none is): the
        error may start at any of them, so no summary may blame a later point alone."""
        return _unmatched(self.points, self.first_beyond)

    @property
    def ops_not_compared(self) -> tuple[str, ...]:
        """The same inside the narrowed layer: ops one arm did not give, before the first op beyond."""
        return _unmatched(self.ops, self.first_beyond_op)

    @property
    def mode(self) -> Mode:
        return Mode.GRAFTED if self.grafted else Mode.ACCUMULATED

    @property
    def first_differs(self) -> str | None:
        """The first point where the arms differ at all: between builds of one model in one
        dtype, where the first kernel that computes differently sits (even within tolerance)."""
        return next((p.name for p in self.points if p.max_abs), None)

    @property
    def grafted_differs(self) -> str | None:
        """The first point whose own computation differs (the reference's input fed in): the
        origin of the error, where the accumulated curve may first cross tolerance far later."""
        return next((p.name for p in self.grafted if p.max_abs), None)

    @property
    def grafted_beyond(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.grafted if p.beyond)

    @property
    def pattern(self) -> str:
        """The error curve in words: nothing, from the first point on, or from one point on."""
        if self.error is not None:
            return "not localised"
        lead = "; ".join(r.words() for r in (*self.not_reproduced, *self.unchecked))
        lead = f"{lead}: " if lead else ""
        gap = f" (not compared: {', '.join(self.not_compared)})" if self.not_compared else ""
        if self.first_beyond is None:
            if self.not_reproduced:
                return lead + "no point beyond tolerance, which localises nothing: the dump did not take the path " \
                              "that produced the divergence" + gap
            return lead + "every point compared within tolerance" + (
                f" (first difference at {self.first_differs})" if self.first_differs
                else (", every point compared equal" if not self.unchecked else ", no difference")) + gap
        names = [p.name for p in self.points if p.rel_diff is not None]
        if self.not_compared:
            return (lead + f"beyond tolerance at {self.first_beyond}, or earlier at a point not compared "
                           f"({', '.join(self.not_compared)}): the error may start at any of them")
        if names and names[0] == self.first_beyond:
            return lead + f"beyond tolerance from the first point captured ({self.first_beyond})"
        return lead + f"within tolerance up to {self.first_beyond}, beyond from there"

    def to_json(self) -> dict:
        return {
            "prompt_id": self.prompt_id,
            "positions": list(self.positions),
            "points": [p.to_json() for p in self.points],
            "first_beyond": self.first_beyond,
            "first_differs": self.first_differs,
            "mode": str(self.mode),
            "tolerance": self.tolerance,
            "reference_engine": self.reference_engine,
            "candidate_engine": self.candidate_engine,
            "grafted": [p.to_json() for p in self.grafted],
            "grafted_beyond": list(self.grafted_beyond),
            "grafted_differs": self.grafted_differs,
            "pattern": self.pattern,
            "reference_note": self.reference_note,
            "error": self.error,
            "kept": self.kept,
            "not_compared": list(self.not_compared),
            "reproduced": {r.arm: r.reproduced for r in self.reproduction},
            "reproduction": [r.to_json() for r in self.reproduction],
            "ops": [p.to_json() for p in self.ops],
            "first_beyond_op": self.first_beyond_op,
            "ops_not_compared": list(self.ops_not_compared),
            "ops_grafted": [p.to_json() for p in self.ops_grafted],
            "alone": {op: str(v) for op, v in self.alone},
            "first_beyond_op_alone": None if (v := self.verdict(self.first_beyond_op)) is None else str(v),
            "op_graft_note": self.op_graft_note,
            "op_graft_refused": self.op_graft_refused,
            "dump_mode": self.dump_mode,
            "decode": None if self.decode is None else self.decode.to_json(),
        }

def _unmatched(points: tuple[PointDiff, ...], first: str | None) -> tuple[str, ...]:
    out = []
    for p in points:
        if p.name == first:
            break
        if p.rel_diff is None:
            out.append(p.name)
    return tuple(out)
