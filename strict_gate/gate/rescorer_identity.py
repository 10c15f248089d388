"""A [rescorer] that is the candidate itself never vouches for the candidate.

Re-scoring stands in for the reference: its gaps decide whether a flip is a near-tie and
whether each later token follows. The candidate scoring its own tokens ranks each one its own
argmax, so every flip looks like a tie and every later token like a follower, whatever it
emitted. The same command line, the same server (one `base_url`, or one `serve` command), or
the same engine kind on the same model files (their digest) in the same dtype is the candidate,
however the table spells it: refused before any engine starts (exit 2, naming [rescorer]),
unless it is as much the reference's engine (a recorded reference made by it): a candidate
that is the reference is then gated against itself, which is honest.
"""

from __future__ import annotations

from pathlib import Path

from strict_gate.engines.base import Engine
from strict_gate.errors import ConfigError
from strict_gate.gate.config import ArmConfig
from strict_gate.runs.records import EngineInfo

SAME_PROCESS = (("resolved_command", "command line"), ("base_url", "server"), ("serve", "server command"))


def same_engine(a: EngineInfo, b: EngineInfo) -> str | None:
    """Why two engine descriptions are one engine, in words; None when they are not."""
    if a.kind != b.kind:
        return None
    oa, ob = a.options, b.options
    for key, what in SAME_PROCESS:
        value = oa.get(key)
        if value and value == ob.get(key) and "{port}" not in str(value):
            return f"the same {what} ({value})"
    digest = oa.get("model_digest")
    if digest and digest == ob.get("model_digest") and oa.get("dtype") == ob.get("dtype"):
        return f"the same model files ({digest}) in the same engine kind ({a.kind}) and dtype ({oa.get('dtype')})"
    return None


def refuse_self_rescorer(rescorer: EngineInfo, candidate: EngineInfo, reference: EngineInfo, config_path: str) -> None:
    """Bad input (exit 2) when the [rescorer] is the candidate and not the reference's engine."""
    same = same_engine(rescorer, candidate)
    if same is not None and same_engine(rescorer, reference) is None:
        raise ConfigError(
            f"[rescorer] is the candidate itself: {same}; re-scored by itself, a candidate vouches for its own "
            "tokens (each its own argmax: every flip a tie, every later token a follower); point [rescorer] at "
            "the reference's engine and model", path=config_path, line=_header_line(config_path))


def check_rescorer(rescorer: ArmConfig | None, candidate: Engine, reference: Engine, config_path: str) -> None:
    """The config's [rescorer], built (not started) to describe itself, against the candidate's
    and the reference's engines; of another kind than the candidate's it is not built."""
    if rescorer is None or rescorer.kind != candidate.kind:
        return
    engine = rescorer.build()
    try:
        refuse_self_rescorer(engine.info(), candidate.info(), reference.info(), config_path)
    finally:
        engine.close()


def _header_line(path: str) -> int | None:
    """The line of the config's [rescorer] header, where it can be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return next((i for i, s in enumerate(lines, start=1) if s.strip() == "[rescorer]"), None)
