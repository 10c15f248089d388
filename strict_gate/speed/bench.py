"""Running the speed arm: inside a gate (the engines it already started) or alone (`strict-gate bench`).

One engine at a time, as in a gate: the candidate is measured on every rung and stopped,
then the reference. A gate cannot do otherwise (it stops the candidate before the reference
starts, so that a GPU holds one engine); `strict-gate bench --interleave` starts both and
lets their repetitions take turns (measure.measure_arms), for machines that hold both. A
recorded reference is stood in for by the gate's [rescorer] (a live engine of the same
model; speed/config.py refuses [speed] otherwise). Every timed reply's tokens are checked
(timed_tokens.py) before a ratio can pass. The speed verdict never changes the token verdict.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import scrub_obj, scrub_tree
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.engines.eos import eos_token_ids
from strict_gate.errors import ConfigError, StrictGateError
from strict_gate.gate.config import GateConfig
from strict_gate.judge.text_only import decoder
from strict_gate.runs.layout import ReportDir, RunDir
from strict_gate.runs.output import ensure_writable_dir
from strict_gate.runs.records import Record, write_text_atomic
from strict_gate.speed.config import SpeedConfig, TokenRules, of
from strict_gate.speed.ladder import build_ladder
from strict_gate.speed.matched import check_matched, compared_rungs
from strict_gate.speed.measure import ArmMeasurement, figures, measure_arm, measure_arms
from strict_gate.speed.model import Method, Order, Rung, RungResult, SpeedResult
from strict_gate.speed.timed_tokens import GateRecords, check_tokens
from strict_gate.speed.verdict import judge_speed

ROLES = ("reference", "candidate")
OnRung = Callable[[str, str], None]  # (role, rung name), as each rung starts


def machine() -> str:
    """CPU model and cores (and GPUs when torch already sees them): the figures depend on it."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = f"{cpu}, {os.cpu_count()} cores"
    torch = sys.modules.get("torch")  # never imported for this
    try:
        if torch is not None and torch.cuda.is_available():
            out += ", " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:
        pass
    return out


class SpeedSession:
    """The speed arm of one gate or bench: the ladder, then each arm measured on its engine."""

    def __init__(self, cfg: SpeedConfig, gate_max_tokens: int, gate_inputs: list[PromptInput],
                 engines: dict[str, Engine], rules: TokenRules, notes: tuple[str, ...] = ()):
        self.cfg = cfg
        self.rules = replace(rules, eos_ids=ignored_eos(engines.values())) if not rules.eos_ids else rules
        self.ladder = build_ladder(cfg, gate_max_tokens, rules.top_logprobs, gate_inputs,
                                   [engines[r] for r in ROLES])
        self.arms: dict[str, ArmMeasurement] = {}
        self.failed: dict[str, str] = {}
        self.gate_records: GateRecords = {}
        self.notes = list(notes)
        self.order = Order.SEQUENTIAL
        texts = [e for e in engines.values() if e.needs_text]  # a text-only arm: equal text verifies its reply
        self.decode = decoder(texts[0].tokenizer_file()) if texts else None

    def measure(self, role: str, engine: Engine, run_dir: Path | None = None, on_rung: OnRung | None = None,
                gate_records: dict[str, Record] | None = None) -> None:
        """Time every rung on `engine` (started if it is not); a failure becomes the arm's error.
        `gate_records` are the arm's own gate run's: the gate rung's timed replies are checked
        against them."""
        if gate_records is not None:
            self.gate_records[role] = gate_records
        if not engine.measurable:
            self.failed[role] = (f"the {role} engine ({engine.kind}) is a stored run and cannot be timed"
                                 if engine.pooled is None else
                                 f"the {role} engine ({engine.kind}) is {engine.pooled.replace('<role>', role)}: "
                                 "not timed (not pooled: the speed arm times one engine alone; time the arm "
                                 "without its ray table, `strict-gate bench`)")
            return
        log = engine_log(RunDir(run_dir).engine_log, engine.log_libraries) if run_dir is not None else nullcontext()
        try:
            with engine.scoped_env(), log:
                self.arms[role] = measure_arm(engine, self.ladder, self.cfg.runs, self.cfg.warmup,
                                              on_rung=(lambda name: on_rung(role, name)) if on_rung else None)
        except StrictGateError as e:
            self.failed[role] = f"the {role} engine failed: {e}"
        except Exception as e:  # an engine bug: the token verdict and the reports must still be written
            self.failed[role] = f"the {role} engine failed: {type(e).__name__}: {e}"

    def measure_interleaved(self, engines: dict[str, Engine], run_dirs: dict[str, Path],
                            on_rung: OnRung | None = None) -> None:
        """Both engines started, their repetitions in turns. An engine that does not start (or
        cannot be timed) is the arm's error, and the other arm is still timed, alone."""
        live = {}
        for role, engine in engines.items():
            if not engine.measurable:
                self.measure(role, engine)  # says why it cannot be timed
                continue
            try:
                with engine.scoped_env(), engine_log(RunDir(run_dirs[role]).engine_log, engine.log_libraries):
                    engine.start()
                live[role] = engine
            except Exception as e:
                self.failed[role] = f"the {role} engine failed: {type(e).__name__}: {e}"
        if len(live) < 2:
            for role, engine in live.items():
                self.measure(role, engine, run_dirs[role], on_rung)
            return
        self.order = Order.INTERLEAVED
        if any(e.in_process and e.env for e in live.values()):  # one process env cannot hold both arms' switches
            self.notes.append("interleaved: an in-process arm's env switches were applied for the whole ladder")
        try:
            with _envs(live.values()):
                self.arms.update(measure_arms(live, self.ladder, self.cfg.runs, self.cfg.warmup, on_rung))
        except Exception as e:
            for role in live:
                self.failed[role] = f"the {role} engine failed: {type(e).__name__}: {e}"

    def skip(self, role: str, why: str) -> None:
        """Not measured (e.g. its token run failed: the engine is not restarted just to be timed)."""
        self.failed[role] = why

    def result(self) -> SpeedResult:
        ref, cand = self.arms.get("reference"), self.arms.get("candidate")
        both = [a for a in (ref, cand) if a is not None]
        streamed = len(both) == 2 and all(a.streams for a in both)
        method = Method.STREAM if streamed else Method.TWO_REQUEST
        rungs, dropped = [], []
        for rung in self.ladder.rungs:
            arm_rungs = {role: a.rungs.get(rung.name) for role, a in self.arms.items()}
            over = {role: r.over_context for role, r in arm_rungs.items() if r is not None and r.over_context}
            if over:
                assert rung.prompt_tokens is not None  # only a sized rung is longer than a context
                dropped.append(f"rung {rung.name} dropped: {rung.prompt_tokens + rung.max_tokens} tokens exceed "
                               + ", ".join(f"the {role}'s max context ({n})" for role, n in over.items()))
                continue
            errors = [f"{role}: {self.failed[role]}" for role in ROLES if role in self.failed]
            errors += [f"{role}: {r.error}" for role, r in arm_rungs.items() if r is not None and r.error]
            figs = {role: figures(r, method) if r is not None else None for role, r in arm_rungs.items()}
            tokens = check_tokens(rung, dict(arm_rungs), self.gate_records, self.rules, self.decode)
            rungs.append(RungResult(rung, figs.get("reference"), figs.get("candidate"),
                                    "; ".join(errors) if errors else None, tokens))
        kept = tuple(r.rung for r in rungs)
        mismatches, matched_notes = check_matched(ref, cand, kept) if ref and cand else ((), ())
        notes = (*self.notes, *self.ladder.notes, *dropped, *self._context_note(), *self._gate_rung_notes(kept, method),
                 *matched_notes)
        notes += tuple(f"{role} not measured: {why}" for role, why in self.failed.items())
        return SpeedResult(method, self.cfg.runs, self.cfg.warmup, tuple(rungs), mismatches,
                           judge_speed(rungs, self.cfg.min_speed_ratio, method=method, mismatches=mismatches),
                           machine=machine(), notes=notes,
                           checked_rungs=compared_rungs(ref, cand, kept) if ref and cand else (),
                           order=self.order, arms={role: a.kind for role, a in self.arms.items()})

    def _context_note(self) -> tuple[str, ...]:
        """Said only when no arm stated a context, before or after it started, and a ladder rung asked."""
        stated = self.ladder.context is not None or any(
            isinstance(a.settings.get("max_context"), int) for a in self.arms.values())
        if stated or all(r.is_gate for r in self.cfg.rungs):
            return ()
        return ("the models' max context is unknown: no rung was checked against it",)

    def _gate_rung_notes(self, kept: tuple[Rung, ...], method: Method) -> tuple[str, ...]:
        if not any(r.prompt_tokens is None for r in kept):
            return ()
        out = ["rung gate: its full requests repeat the gate's own prompts in every repetition (in a gate, "
               "after its token run too): an engine with a prefix cache answers their prefill from it, so "
               "compare the arms' prefix_cache (the matched check does, where both state it); its "
               "max_tokens=1 requests get a fresh prompt of each prompt's length, never a cached one"]
        if method is Method.TWO_REQUEST and self.ladder.space is None and self.ladder.text is None:
            out.append("rung gate: no vocabulary is known to draw those fresh prompts, so its two-request "
                       "TTFT and decode were not measured (give either arm a `tokenizer`)")
        return tuple(out)


def stand_in_note(cfg: GateConfig) -> tuple[str, ...]:
    if cfg.speed_reference is cfg.reference:
        return ()
    assert cfg.rescorer is not None  # the only stand-in
    return (f"the reference is a recorded baseline: the [rescorer] ({cfg.rescorer.kind}, same model) "
            "was timed as the speed reference",)


def gate_speed(cfg: GateConfig, inputs: list[PromptInput], reference: Engine, candidate: Engine,
               build_rescorer: Callable[[], Engine]) -> tuple[SpeedSession | None, Engine | None]:
    """A gate's speed session and the engine timed as its reference: the reference itself, or
    (a recorded baseline) the [rescorer], built here so that diagnosis and speed share one load."""
    settings = of(cfg)
    if settings is None:
        return None, None
    speed_ref = reference if cfg.speed_reference is cfg.reference else build_rescorer()
    engines = {"reference": speed_ref, "candidate": candidate}
    return SpeedSession(settings, cfg.max_tokens, inputs, engines, token_rules(cfg), stand_in_note(cfg)), speed_ref


def ignored_eos(engines) -> frozenset[int]:
    """The EOS ids the timed requests tell the arms to go past: each arm's `eos_token_ids`, else
    those of the model directory holding its tokenizer (engines/eos.py)."""
    ids: set[int] = set()
    for e in engines:
        stated = getattr(e, "eos_token_ids", None)
        tok = e.tokenizer_file() if not stated else None
        try:
            ids.update(stated or (eos_token_ids(tok) if tok is not None else None) or ())
        except ConfigError:  # unreadable model files: no EOS dropped from this arm's check (stricter)
            continue
    return frozenset(ids)


def token_rules(cfg: GateConfig) -> TokenRules:
    return TokenRules(cfg.top_logprobs, cfg.band, cfg.greedy_tolerance)


def timed_run(session: SpeedSession, role: str, engine: Engine, run, run_dir: Path) -> None:
    """Time a gate's arm on its engine, unless its token run failed (an engine that died is not
    restarted just to be timed: the rungs say why they were not measured). The gate rung's
    timed tokens are checked against the run's records."""
    if run is not None and not run.complete:
        session.skip(role, f"the {role}'s token run did not complete ({run.manifest.error or 'not finished'})")
    else:
        session.measure(role, engine, run_dir, gate_records=run.records if run is not None else None)


@contextmanager
def _envs(engines):
    """Every engine's env switches at once (interleaved arms share the process's environment)."""
    with ExitStack() as stack:
        for engine in engines:
            stack.enter_context(engine.scoped_env())
        yield


@dataclass(frozen=True)
class BenchOutcome:
    result: SpeedResult
    path: Path  # <output dir>/<name>-<timestamp>/speed.json


def write_speed(result: SpeedResult, out_dir: Path) -> Path:
    path = ReportDir(out_dir).speed
    write_text_atomic(path, json.dumps(result.to_json(), indent=2) + "\n")
    return path


def run_bench(cfg: GateConfig, *, output_dir: Path | None = None, on_rung: OnRung | None = None,
              interleave: bool = False) -> BenchOutcome:
    """Only the speed arm of a gate config: writes <output_dir>/<name>-<timestamp>/speed.json, a
    fresh directory each time (as a gate's report directory), never over an earlier bench.
    `interleave`: both engines loaded at once, their repetitions in turns."""
    from strict_gate.gate.arm import prompt_inputs
    from strict_gate.gate.outcome import new_report_dir
    from strict_gate.runs.prompts import load_prompts

    settings = of(cfg)
    if settings is None:
        raise ConfigError("no [speed] table: `strict-gate bench` runs a gate config's [speed] ladder", path=cfg.path)
    if cfg.candidate is None:
        raise ConfigError("needs a [candidate] table", path=cfg.path)
    root = output_dir or cfg.output_dir
    ensure_writable_dir(root)
    engines = {"reference": cfg.speed_reference.build(), "candidate": cfg.candidate.build()}
    inputs: list[PromptInput] = []
    if any(r.is_gate for r in settings.rungs):  # the gate's own prompts, tokenized as the gate does
        tokenizer = engines["reference"] if cfg.speed_reference is cfg.reference else cfg.reference.build()
        inputs = prompt_inputs(load_prompts(cfg.prompts), tokenizer)
    session = SpeedSession(settings, cfg.max_tokens, inputs, engines, token_rules(cfg), stand_in_note(cfg))
    out_dir = new_report_dir(root, cfg.name)
    dirs = {role: out_dir / role for role in engines}
    for role, engine in engines.items():
        if engine.writes_log:
            dirs[role].mkdir(parents=True, exist_ok=True)
            engine.set_log_path(RunDir(dirs[role]).engine_log)
    try:
        if interleave:
            session.measure_interleaved(engines, dirs, on_rung)
        else:
            for role in ("candidate", "reference"):  # one engine loaded at a time
                try:
                    session.measure(role, engines[role], dirs[role], on_rung)
                finally:
                    _close(engines[role], dirs[role])
    finally:
        for role, engine in engines.items():
            _close(engine, dirs[role])  # safe twice
        scrub_tree(out_dir)  # engine logs too: a server may log its key
    result = scrub_obj(session.result())  # a rung's engine error may quote it: speed.json and the console
    return BenchOutcome(result, write_speed(result, out_dir))


def _close(engine: Engine, run_dir: Path) -> None:
    """Stop an engine; what it logs on the way out goes to its engine.log."""
    with engine_log(RunDir(run_dir).engine_log, engine.log_libraries):
        engine.close()
