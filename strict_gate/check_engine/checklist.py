"""check-engine's checklist: one line per check (pass, fail, not applicable, skipped), what each
failure saw and the section of docs/engine-protocol.md to read, and the stable JSON CI reads
(schema strict-gate/check-engine@1). Exit 0 only when no check failed or was skipped; 3 when the
engine never started.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

SCHEMA = "strict-gate/check-engine@1"
PAGE = "docs/engine-protocol.md"  # the command protocol's page: for command engines
OTHER_PAGE = "docs/configuring-engines.md (what each kind needs; openai: \"What the openai arm needs from a server\")"
DETAIL_CHARS = 1200  # an engine's stderr tail is quoted in a failure; the checklist keeps its start


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not_applicable"  # the engine does not have what the check is about
    SKIPPED = "skipped"  # could not run: what it needs failed earlier (that check says why)

    @property
    def label(self) -> str:
        return {"pass": "pass", "fail": "FAIL", "not_applicable": "n/a", "skipped": "skipped"}[self.value]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    section: str  # of docs/engine-protocol.md, e.g. "4 generate"
    detail: str
    finding: bool = False  # a failure is the engine's numerics, not a protocol error

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status.value, "section": self.section,
                "detail": self.detail, "finding": self.finding}


def clip(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + f"... ({len(text)} chars)"


@dataclass(frozen=True)
class Checklist:
    engine: dict  # kind, model, versions (EngineInfo's, secrets redacted)
    prompts: str  # where the prompt ids came from
    tolerance: str  # what prefill/decode and determinism were judged against
    log: str  # the engine's log
    checks: tuple[Check, ...]
    started: bool = True

    @property
    def exit_code(self) -> int:
        if not self.started:
            return 3
        return 1 if any(c.status in (Status.FAIL, Status.SKIPPED) for c in self.checks) else 0

    def counts(self) -> dict[str, int]:
        return {s.value: sum(1 for c in self.checks if c.status is s) for s in Status}

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "exit_code": self.exit_code, "engine": self.engine, "prompts": self.prompts,
                "tolerance": self.tolerance, "log": self.log, "counts": self.counts(),
                "checks": [c.to_json() for c in self.checks]}

    def lines(self) -> list[str]:
        """The checklist as the terminal shows it."""
        e = self.engine
        versions = ", ".join(f"{k} {v}" for k, v in (e.get("versions") or {}).items())
        out = [f"check-engine: {e.get('kind')} engine, model {e.get('model')}" + (f" ({versions})" if versions else ""),
               f"prompts: {self.prompts}", f"tolerance: {self.tolerance}", f"engine log: {self.log}", ""]
        width = max(len(c.name) for c in self.checks)
        pad = " " * (width + 12)
        for c in self.checks:
            first, *rest = c.detail.splitlines() or [""]  # an engine's log tail: its own lines
            out.append(f"  {c.status.label:<8} {c.name:<{width}}  {first}")
            out += [pad + line for line in rest]
            if c.status is Status.FAIL:
                what = "an engine finding, not a protocol error; see" if c.finding else "read"
                where = f"{PAGE}, section {c.section}" if e.get("kind") == "command" else OTHER_PAGE
                out.append(f"{pad}-> {what} {where}")
        n = self.counts()
        out += ["", f"{len(self.checks)} checks: {n['pass']} pass, {n['fail']} fail, {n['not_applicable']} n/a, "
                    f"{n['skipped']} skipped -> exit {self.exit_code}"]
        return out
