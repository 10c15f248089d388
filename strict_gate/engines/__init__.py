"""Engine registry: kind -> "module:Class", imported only when a gate asks for that kind.

Other packages add kinds under the entry-point group `strict_gate.engines`
(docs/engine-plugins.md); those are read only when a kind is not built in, so a broken or
clashing plugin never changes what a built-in kind builds.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points

from strict_gate.core.options import did_you_mean
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError
from strict_gate.runs.records import ScoredStep

ENGINES: dict[str, str] = {
    "hf": "strict_gate.engines.hf:HFEngine",
    "vllm": "strict_gate.engines.vllm.engine:VLLMEngine",
    "openai": "strict_gate.engines.openai.engine:OpenAIEngine",
    "command": "strict_gate.engines.command.engine:CommandEngine",
    "recorded": "strict_gate.engines.recorded:RecordedEngine",
}
PLUGIN_GROUP = "strict_gate.engines"


def _origin(ep: EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "an unnamed distribution"
    return f"{ep.value!r} from {dist}"


def plugin_engines() -> dict[str, EntryPoint]:
    """The kinds other packages register, read (not imported) from their metadata each call, so a
    package installed mid-session is seen. A name a built-in holds is refused, naming both."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name in ENGINES:
            raise ConfigError(
                f"engine plugin {ep.name!r} ({_origin(ep)}, entry-point group {PLUGIN_GROUP!r}) clashes with the "
                f"built-in kind {ep.name!r} ({ENGINES[ep.name]}); the built-in wins: register the plugin under "
                "another name")
        found.setdefault(ep.name, ep)
    return found


def _plugin_class(kind: str, ep: EntryPoint) -> type[Engine]:
    try:
        cls = ep.load()
    except Exception as e:  # a plugin's own import failure, reported as its config error
        raise ConfigError(f"engine plugin {kind!r} ({_origin(ep)}) failed to load: {type(e).__name__}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ConfigError(f"engine plugin {kind!r} ({_origin(ep)}) is not a strict_gate.engines.Engine subclass")
    return cls


def engine_class(kind: str) -> type[Engine]:
    """The engine class for `kind`; an unknown kind is answered with the known ones, plugins too."""
    if kind in ENGINES:
        module, _, cls = ENGINES[kind].partition(":")
        return getattr(importlib.import_module(module), cls)
    plugins = plugin_engines()
    if kind in plugins:
        return _plugin_class(kind, plugins[kind])
    known = sorted(ENGINES)
    extra = f"; plugins: {', '.join(sorted(plugins))}" if plugins else ""
    raise ConfigError(
        f"unknown engine kind {kind!r}{did_you_mean(kind, [*ENGINES, *plugins])} (known: {', '.join(known)}{extra})"
    )


__all__ = ["ENGINES", "PLUGIN_GROUP", "Engine", "PromptInput", "ScoredStep", "engine_class", "plugin_engines"]
