"""Run the checks in order on one arm and collect the checklist.

One engine, started once (again after a check got it killed), fed a few prompts. The order
matters: the greedy check's records are what later checks compare with, the determinism check
repeats the greedy check's last request back to back, and the EOF check, which ends the
process, comes last. Protocol-only checks are not applicable to engines the gate does not drive
over the line protocol (hf, vllm, openai).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from strict_gate.check_engine.capabilities import dump, dump_decode, graft, graft_ops, in_flight, prefill_chunk
from strict_gate.check_engine.checklist import Check, Checklist, Status, clip
from strict_gate.check_engine.generation import (
    determinism,
    eos,
    greedy,
    ignore_eos,
    max_tokens,
    ties,
    timing,
    top_logprobs,
)
from strict_gate.check_engine.http import http_stream, not_protocol
from strict_gate.check_engine.numerics import Tolerance
from strict_gate.check_engine.probe import Failed, Probe, Skipped, prompt_inputs
from strict_gate.check_engine.protocol import eof, hello, malformed, stream, unknown_op
from strict_gate.check_engine.scoring import prefill_decode, score
from strict_gate.core.engine_log import engine_log
from strict_gate.core.redact import scrub
from strict_gate.engines import engine_class
from strict_gate.errors import ConfigError, EngineError
from strict_gate.gate.config import ArmConfig, load_arm_config, load_gate_config
from strict_gate.runs.prompts import PromptSet

ARMS = ("reference", "candidate", "rescorer")


@dataclass(frozen=True)
class Spec:
    name: str
    section: str  # of docs/engine-protocol.md
    run: Callable[[Probe], tuple[Status, str]]
    protocol_only: bool = False  # needs the line protocol: a hello, raw requests, stdin
    finding: bool = False  # a failure is the engine's numerics, not a protocol error
    http: Callable[[Probe], tuple[Status, str]] | None = None  # the check's form for an HTTP server (openai)


CHECKS = (
    Spec("hello", "4 hello", hello, protocol_only=True),
    Spec("greedy", "4 generate", greedy),
    Spec("determinism", "4 generate", determinism),
    Spec("max_tokens", "4 generate", max_tokens),
    Spec("eos", "4 generate (which ids end a sequence)", eos),
    Spec("ignore_eos", "5 (ignore_eos)", ignore_eos),
    Spec("top_logprobs", "4 generate (top_logprobs)", top_logprobs),
    Spec("ties", "4 generate (exact ties at the argmax)", ties),
    Spec("score", "4 score", score),
    Spec("prefill_decode", "4 score (prefill and decode)", prefill_decode, finding=True),
    Spec("in_flight", "5 (requests in flight: max_in_flight)", in_flight, protocol_only=True, finding=True),
    Spec("prefill_chunk", "5 (requests in flight: prefill_chunk)", prefill_chunk, protocol_only=True, finding=True),
    Spec("dump", "4 dump", dump),
    Spec("graft", "4 dump (graft)", graft),
    Spec("graft_ops", "4 dump (graft_ops)", graft_ops),
    Spec("dump_decode", "4 dump (mode decode)", dump_decode),
    Spec("stream", "5 (token events)", stream, protocol_only=True, http=http_stream),
    Spec("unknown_op", "4 hello (an op you do not know)", unknown_op, protocol_only=True),
    Spec("malformed", "4 generate (a request you cannot read)", malformed, protocol_only=True),
    Spec("timing", "4 generate (timing) and 1 (timeout_s)", timing),
    Spec("eof", "2 lifecycle", eof, protocol_only=True),
)


def load_engine_arm(path: str | Path, arm: str = "candidate") -> ArmConfig:
    """An ENGINE.toml as `strict-gate run` reads it; of a gate config, the arm named (by default
    the candidate: the engine a gate puts on trial). A stored run is refused: it is not an engine."""
    if arm not in ARMS:
        raise ConfigError(f"--arm must be one of {', '.join(ARMS)}, not {arm!r}")
    cfg = load_arm_config(path)
    if cfg.role == "reference" and arm != "reference":  # a gate config: load_arm_config gave its [reference]
        chosen = getattr(load_gate_config(path, require_candidate=False), arm)
        if chosen is None:
            raise ConfigError(f"the gate config has no [{arm}] table", path=str(path))
        cfg = chosen
    if not engine_class(cfg.kind).measurable:
        raise ConfigError(f"[{cfg.role}] is a stored run (kind = {cfg.kind!r}), not an engine: check-engine "
                          "checks a live one (a stored run is audited when read)", path=str(path))
    return cfg


def _run(spec: Spec, probe: Probe) -> Check:
    def made(status: Status, detail: str) -> Check:
        return Check(spec.name, status, spec.section, clip(scrub(detail)), spec.finding)

    run = spec.run
    if spec.protocol_only and probe.command is None:
        if spec.http is None or not probe.engine.speaks_http:
            return made(Status.NOT_APPLICABLE, not_protocol(probe))
        run = spec.http
    try:
        return made(*run(probe))
    except Skipped as e:
        return made(Status.SKIPPED, str(e))
    except (Failed, EngineError) as e:
        return made(Status.FAIL, str(e))


def _tolerance(probe: Probe, dtype: str | None) -> Tolerance:
    if dtype is not None:
        return Tolerance.for_dtype(dtype, "--dtype")
    stated = probe.engine.speed_settings().get("dtype")
    source = "the hello" if probe.command is not None else f"the {probe.engine.kind} options"
    return Tolerance.for_dtype(stated if isinstance(stated, str) else None, source)


def check_engine(arm: ArmConfig, *, prompts: PromptSet | None = None, dtype: str | None = None,
                 log_dir: Path | None = None) -> Checklist:
    """Every check on the arm's engine; an engine that never starts fails the first and skips the rest."""
    engine = arm.build()
    log = Path(log_dir or tempfile.mkdtemp(prefix="strict-gate-check-")) / "engine.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if engine.writes_log:
        engine.set_log_path(log)
    with engine.scoped_env(), engine_log(log, engine.log_libraries):
        try:
            inputs, source = prompt_inputs(engine, prompts)
            probe = Probe(engine, inputs, Tolerance.for_dtype(None, ""))
            try:
                probe.start()
            except EngineError as e:
                first = Check(CHECKS[0].name, Status.FAIL, CHECKS[0].section,
                              clip(scrub(f"the engine never started: {e}")))
                rest = [Check(s.name, Status.SKIPPED, s.section, "the engine never started", s.finding)
                        for s in CHECKS[1:]]
                return Checklist(engine.info().to_json(), source, "not judged", str(log), (first, *rest), False)
            probe.tolerance = _tolerance(probe, dtype)
            checks = tuple(_run(spec, probe) for spec in CHECKS)
            info = engine.info().to_json()
        finally:
            engine.close()
    described = {k: info[k] for k in ("kind", "model", "versions")}
    return Checklist(described, source, probe.tolerance.describe(), str(log), checks)
