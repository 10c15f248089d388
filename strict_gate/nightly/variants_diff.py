"""Night to night for the [invariance] variants: a variant that held last night and moves
tonight (fewer prompts equal to the arm's batch-1 run, or a verdict that got worse).

Read from report.json's `invariance.variants[]` (no engine, no torch). A variant only one night
ran is listed as added or removed, never as a regression; a report without the object has no
variants to compare. A speculative variant is compared the same way (exact prompts, verdict);
its acceptance rate rides along, so a night whose speculation stopped paying is listed too.

A candidate variant run beside the reference's (`beside_reference`, invariance/moves.py) holds
a prompt that moves with the reference as it holds an exact one: a night where vLLM and the
candidate both moved one more prompt the same way is no regression of the candidate. A
reference variant whose moves are the yardstick (`yardstick`) ranks as a pass: its moves are
vLLM's own, never the candidate's.
"""

from __future__ import annotations

from dataclasses import dataclass

from strict_gate.errors import InputError
from strict_gate.invariance.verdict import Pairing

_ORDER = {"pass": 0, "yardstick": 0, "fail": 1, "incomplete": 2}
WITH_REFERENCE = Pairing.WITH_REFERENCE.value


@dataclass(frozen=True)
class VariantChange:
    arm: str
    name: str
    old: dict | None  # {"verdict", "prompts_exact", "prompts_total"[, "with_reference"]}; None: not run last night
    new: dict | None

    @property
    def label(self) -> str:
        return f"{self.arm} {self.name}"

    @property
    def started_moving(self) -> bool:
        """Both nights ran it, and tonight fewer prompts held (exact, or moved with the reference),
        or its verdict is worse."""
        if self.old is None or self.new is None:
            return False
        return _held(self.new) < _held(self.old) or _ORDER[self.new["verdict"]] > _ORDER[self.old["verdict"]]

    def to_json(self) -> dict:
        return {"arm": self.arm, "name": self.name, "old": self.old, "new": self.new,
                "started_moving": self.started_moving}


def _held(x: dict) -> int:
    return x["prompts_exact"] + x.get("with_reference", 0)


def _with_reference(beside: object) -> int | None:
    """How many prompts moved with the reference, when the variant ran beside it."""
    ids = beside.get(WITH_REFERENCE) if isinstance(beside, dict) else None
    return len(ids) if isinstance(ids, list) else None


def _variants(report: dict, path: str) -> dict[tuple[str, str], dict]:
    inv = report.get("invariance")
    if inv is None:
        return {}
    rows = inv.get("variants") if isinstance(inv, dict) else None
    if not isinstance(rows, list):
        raise InputError('"invariance" needs a "variants" list', path=path)
    out = {}
    for i, v in enumerate(rows):
        ok = (isinstance(v, dict) and isinstance(v.get("arm"), str) and isinstance(v.get("name"), str)
              and v.get("verdict") in _ORDER
              and all(isinstance(v.get(k), int) and not isinstance(v.get(k), bool)
                      for k in ("prompts_exact", "prompts_total")))
        if not ok:
            raise InputError(f"invariance.variants[{i}] needs arm, name, verdict ({', '.join(_ORDER)}), "
                             "prompts_exact and prompts_total", path=path)
        out[(v["arm"], v["name"])] = {k: v[k] for k in ("verdict", "prompts_exact", "prompts_total")}
        rate = _rate(v.get("acceptance"))
        if rate is not None:
            out[(v["arm"], v["name"])]["acceptance_rate"] = rate
        shared = _with_reference(v.get("beside_reference"))
        if shared is not None:
            out[(v["arm"], v["name"])]["with_reference"] = shared
    return out


def _rate(acceptance: object) -> float | None:
    """A speculative variant's acceptance rate, when its report gives one (a number in [0, 1])."""
    rate = acceptance.get("acceptance_rate") if isinstance(acceptance, dict) else None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate <= 1:
        return float(rate)
    return None


def variant_changes(old: dict, new: dict, *, old_path: str = "old", new_path: str = "new") -> tuple[VariantChange, ...]:
    """Every variant whose figures differ between the nights, or that only one night ran."""
    a, b = _variants(old, old_path), _variants(new, new_path)
    keys = list(dict.fromkeys([*a, *b]))
    return tuple(VariantChange(arm, name, a.get((arm, name)), b.get((arm, name)))
                 for arm, name in keys if a.get((arm, name)) != b.get((arm, name)))


def markdown_lines(changes: tuple[VariantChange, ...]) -> list[str]:
    from strict_gate.report.text import md

    if not changes:
        return []

    def cell(x: dict | None) -> str:
        if x is None:
            return "not run"
        rate = f", acceptance {x['acceptance_rate']:.1%}" if "acceptance_rate" in x else ""
        shared = f", {x['with_reference']} {WITH_REFERENCE}" if "with_reference" in x else ""
        return f"{x['verdict']}, {x['prompts_exact']}/{x['prompts_total']} exact{shared}{rate}"

    out = ["### Invariance variants", "", "| variant | last night | tonight | |", "|---|---|---|---|"]
    out += [f"| {md(c.label)} | {cell(c.old)} | {cell(c.new)} | {'started to move' if c.started_moving else ''} |"
            for c in changes]
    return [*out, ""]
