"""gate-state.json: what `strict-gate gate --resume` needs, written when a gate starts.

An interrupted gate has no report.json, so the facts a resume depends on are recorded up
front, atomically, from the gate's GateSpec: where the config came from (its relative paths
resolve against that folder, not the report directory), the policy and band in force (the
command line may have overridden the config's), and a fingerprint of every setting in the
config. A resume
refuses a gate.toml or prompt set that no longer matches, naming the setting. The
fingerprint holds digests, not values: an arm's env or options may carry secrets.

The state is sealed: it holds the sha256 of the report's gate.toml, the key of the arms'
record seals (runs/seal.py) and a digest of its own fields, so an edited state, a gate.toml
and state copied from another gate, or a record moved between runs is refused. A finished
gate adds its verdicts (tokens, speed, ...) and exit code: a resume of it says them again.
The report directory's gate.lock (flock) is held by the one gate working in it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

from strict_gate.core.redact import is_secret_name
from strict_gate.errors import ConfigError, InputError
from strict_gate.gate.config import GateConfig
from strict_gate.judge.policy import Policy, check_policy
from strict_gate.judge.spec import ConfigRef, GateSpec
from strict_gate.report import GateResult
from strict_gate.runs.layout import ReportDir, ReportFile
from strict_gate.runs.prompts import PromptSet
from strict_gate.runs.records import now_iso, write_json_atomic

STATE_SCHEMA = "strict-gate/gate-state@2"
PROMPT_SHA = "prompt set sha256"
GATE = "gate"


@dataclass(frozen=True)
class GateState:
    config: ConfigRef  # the config the gate was started with (REPORT_DIR/gate.toml is its copy)
    policy: Policy
    band: float
    prompt_sha256: str
    fingerprint: dict[str, str]  # setting -> digest of its value
    started: str
    config_sha256: str  # of REPORT_DIR/gate.toml as written
    seal_key: str  # starts each arm's record seal (runs/seal.py)
    verdicts: dict[str, str] = field(default_factory=dict)  # a finished gate's: "tokens", "speed", ...
    exit_code: int | None = None  # a finished gate's
    command: str = GATE  # what made the directory: a gate, or `strict-gate invariance` alone (its --resume)

    def arm_key(self, role: str) -> str:
        return f"{self.seal_key}:{role}"

    def body(self) -> dict:
        out = {
            "schema": STATE_SCHEMA,
            "started": self.started,
            "config": self.config.to_json(),
            "config_sha256": self.config_sha256,
            "seal_key": self.seal_key,
            "policy": self.policy,
            "band": self.band,
            "prompt_set": {"sha256": self.prompt_sha256},
            "fingerprint": self.fingerprint,
        }
        if self.command != GATE:  # a gate's state is written as it was before `command` existed
            out["command"] = self.command
        if self.exit_code is not None:
            out["finished"] = {"verdicts": self.verdicts, "exit_code": self.exit_code}
        return out

    def to_json(self) -> dict:
        return self.body() | {"digest": _digest(self.body())}


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def fingerprint(cfg: GateConfig, ps: PromptSet) -> dict[str, str]:
    """Every setting that shapes the records or the verdict, named as a user would look for it."""
    values: dict[str, object] = {
        "name": cfg.name, PROMPT_SHA: ps.sha256, "max_tokens": cfg.max_tokens,
        "top_logprobs": cfg.top_logprobs, "policy": cfg.policy, "band": cfg.band, "diagnose": cfg.diagnose,
        "greedy_tolerance": cfg.greedy_tolerance, "drift": cfg.drift,
    }
    for role, arm in (("reference", cfg.reference), ("candidate", cfg.candidate), ("rescorer", cfg.rescorer)):
        if arm is None:
            continue
        values[f"[{role}] kind"] = arm.kind
        values[f"[{role}] runs"] = arm.runs
        values.update({f"[{role}] {k}": v for k, v in asdict(arm.options).items()})
        # Secret-named entries are not fingerprinted: the report's gate.toml holds them as
        # "<redacted>" (on resume its value comes from the environment, where the secret lives).
        values.update({f"[{role}.env] {k}": v for k, v in arm.env.items() if not is_secret_name(k)})
    return {name: _digest(v) for name, v in values.items()}


def write_gate_state(report: ReportDir, cfg: GateConfig, ps: PromptSet, spec: GateSpec,
                     command: str = GATE) -> GateState:
    """The spec the gate runs under, and the fingerprint of the config it was built from
    (call after REPORT_DIR/gate.toml is written: its hash is sealed in). `command` is the one
    that continues it: `strict-gate gate --resume`, or `strict-gate invariance --resume`."""
    if spec.config is None:
        raise TypeError("a gate's spec names the config it came from")
    state = GateState(
        config=spec.config,
        policy=spec.policy,
        band=spec.band,
        prompt_sha256=ps.sha256,
        fingerprint=fingerprint(cfg, ps),
        started=now_iso(),
        config_sha256=_file_sha256(report),
        seal_key=secrets.token_hex(16),
        command=command,
    )
    write_json_atomic(report.state, state.to_json())
    return state


def record_verdicts(report: ReportDir, state: GateState, verdicts: dict[str, str], exit_code: int) -> GateState:
    """A finished gate's verdicts, every one it had, so `--resume` of it exits as it did."""
    done = replace(state, verdicts=dict(verdicts), exit_code=int(exit_code))
    write_json_atomic(report.state, done.to_json())
    return done


def _file_sha256(report: ReportDir) -> str:
    return hashlib.sha256(report.gate_toml.read_bytes()).hexdigest()


def read_gate_state(report: ReportDir) -> GateState:
    """The gate state, refused when its digest does not match its fields."""
    path = report.state
    if not report.gate_toml.exists():
        raise InputError(f"not a gate report directory ({ReportFile.GATE_TOML} is missing)", path=str(report.path))
    if not path.exists():
        raise InputError(
            f"{ReportFile.STATE} is missing: the gate was stopped before it started its arms, or was run by a "
            "strict-gate without resume; start the gate again",
            path=str(report.path),
        )
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("schema") != STATE_SCHEMA:
            raise InputError(f'"schema" is {d.get("schema")!r}; this version reads {STATE_SCHEMA!r}', path=str(path))
        finished = d.get("finished")
        state = GateState(
            config=ConfigRef(str(d["config"]["path"]), str(d["config"]["base_dir"])),
            policy=check_policy(str(d["policy"])),
            band=float(d["band"]),
            prompt_sha256=str(d["prompt_set"]["sha256"]),
            fingerprint={str(k): str(v) for k, v in dict(d["fingerprint"]).items()},
            started=str(d["started"]),
            config_sha256=str(d["config_sha256"]),
            seal_key=str(d["seal_key"]),
            verdicts={str(k): str(v) for k, v in dict(finished["verdicts"]).items()} if finished else {},
            exit_code=int(finished["exit_code"]) if finished else None,
            command=str(d.get("command", GATE)),
        )
        digest = d["digest"]
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg}", path=str(path), line=e.lineno) from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"not a gate state ({type(e).__name__}: {e})", path=str(path)) from None
    if digest != _digest(state.body()):
        raise InputError("its digest does not match its fields: the gate state was edited; start a new gate",
                         path=str(path))
    return state


def check_config_file(report: ReportDir, state: GateState) -> None:
    """REPORT_DIR/gate.toml is byte for byte the one the state was written with (after
    check_unchanged, which names a changed setting; this catches every other edit)."""
    if _file_sha256(report) != state.config_sha256:
        raise InputError(f"{ReportFile.GATE_TOML} is not the one this gate state was written with (copied from "
                         "another gate, or edited); start a new gate", path=str(report.gate_toml))


@contextmanager
def report_lock(report: ReportDir) -> Iterator[None]:
    """Held for a whole gate or resume: a second one on the same directory is refused (exit 2)."""
    fd = os.open(report.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another strict-gate gate is working in this report directory ({ReportFile.LOCK} is "
                             "held); wait for it to finish or stop it, then resume", path=str(report.path)) from None
        yield
    finally:
        os.close(fd)


def check_unchanged(state: GateState, cfg: GateConfig, ps: PromptSet) -> None:
    """Refuse a config or prompt set that changed since the gate started, naming the setting."""
    if ps.sha256 != state.prompt_sha256:
        raise ConfigError(
            f"{PROMPT_SHA} is {ps.sha256} now, the gate started with {state.prompt_sha256}: "
            "the prompt set changed, so the prompts already done cannot be kept; start a new gate",
            path=str(cfg.prompts),
        )
    now = fingerprint(cfg, ps)
    for name in sorted(now.keys() | state.fingerprint.keys()):
        if now.get(name) != state.fingerprint.get(name):
            how = "was added" if name not in state.fingerprint else "was removed" if name not in now else "changed"
            raise ConfigError(
                f"{name} {how} since the gate started; a resumed gate runs under the config it started "
                "with (start a new gate for a new config)",
                path=cfg.path,
            )


def verdicts(result: GateResult) -> dict[str, str]:
    """Every verdict a gate gives, by name: what a resume of the finished gate says again."""
    return {"tokens": str(result.verdict.verdict)} | {
        name: result.features[name].section_verdict for name in sorted(result.features)}


def check_command(report: ReportDir, state: GateState, command: str) -> None:
    """A directory is continued by the command that made it: a gate's arms are never run into a
    `strict-gate invariance` directory, nor a gate's arms skipped by `invariance --resume`."""
    if state.command != command:
        raise InputError(f"this report directory was made by `strict-gate {state.command}`: continue it with "
                         f"`strict-gate {state.command} --resume`", path=str(report.path))


def reopen(report: ReportDir, command: str) -> tuple[GateState, GateConfig, PromptSet]:
    """What a `--resume` continues from: the sealed state (of the command that made the directory),
    the config re-read as the gate resolved it, and its prompts; refused (exit 2) when either
    changed since the gate started or gate.toml fails its hash."""
    from pathlib import Path

    from strict_gate.gate.config import load_copied_config
    from strict_gate.runs.prompts import load_prompts

    state = read_gate_state(report)
    check_command(report, state, command)
    cfg = load_copied_config(report.gate_toml, started=state.config.path, base_dir=Path(state.config.base_dir))
    ps = load_prompts(cfg.prompts)
    check_unchanged(state, cfg, ps)
    check_config_file(report, state)
    return state, cfg, ps
