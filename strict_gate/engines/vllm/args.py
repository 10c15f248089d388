"""Which keyword arguments `vllm.LLM` accepts: its own `__init__` parameters plus the fields
of `vllm.engine.arg_utils.EngineArgs` (where LLM sends the rest of its keywords).

Read from the installed vLLM's source (ast), without importing it: a config check stays at
milliseconds, and a gate whose vllm arm is only a [rescorer] imports nothing unless
something diverges. A name the source reading does not know is confirmed by importing vLLM
and inspecting the real signature before it is refused, so a vLLM laid out differently
can only cost time, never refuse a valid argument.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
from pathlib import Path

_SOURCES = (("entrypoints/llm.py", "LLM", "__init__"), ("engine/arg_utils.py", "EngineArgs", None))


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _source_names(root: Path) -> set[str] | None:
    """The names as the source declares them; None when the source is not laid out as expected."""
    names: set[str] = set()
    for rel, cls_name, method in _SOURCES:
        try:
            cls = _class(ast.parse((root / rel).read_text(encoding="utf-8")), cls_name)
        except (OSError, SyntaxError, ValueError):
            return None
        if cls is None:
            return None
        if method is None:
            names |= {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            continue
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None)
        if init is None:
            return None
        names |= {a.arg for a in init.args.args + init.args.kwonlyargs} - {"self"}
    return names


def _imported_names() -> set[str] | None:
    """The names from the imported vLLM (None when it cannot be imported: start() will say why)."""
    try:
        import vllm
        from vllm.engine.arg_utils import EngineArgs
    except Exception:
        return None
    params = inspect.signature(vllm.LLM.__init__).parameters.values()
    own = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    return own | {f.name for f in dataclasses.fields(EngineArgs)}


def unknown_llm_args(names: list[str]) -> tuple[list[str], set[str]]:
    """(the names vllm.LLM would refuse, the names it accepts); ([], set()) when vLLM is not
    installed or cannot be imported, so nothing can be checked before start()."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return [], set()
    known = _source_names(Path(next(iter(spec.submodule_search_locations))))
    if known is not None and all(n in known for n in names):
        return [], known
    known = _imported_names()
    if known is None:
        return [], set()
    return [n for n in names if n not in known], known


def vllm_speed_settings(options, effective: dict, model_path: str) -> dict:
    """The matched-config facts of a vLLM arm: what vLLM chose where it has started, else the
    options, else vLLM's defaults (compiled unless enforce_eager; prefix caching on)."""
    from strict_gate.core.model_files import model_max_context

    def pick(name, default=None):
        for source in (effective, options.engine_args):
            if source.get(name) is not None:
                return source[name]
        value = getattr(options, name, None)
        return default if value is None else value

    dtype = str(pick("dtype", options.dtype)).removeprefix("torch.")
    kv_bytes, util = pick("kv_cache_memory_bytes"), pick("gpu_memory_utilization")
    kv = f"kv_cache_memory_bytes={kv_bytes}" if kv_bytes else f"gpu_memory_utilization={util}" if util else None
    return {
        "dtype": None if dtype == "auto" else dtype,
        "eager": bool(pick("enforce_eager", False)),
        "kv_cache": kv,
        "prefix_cache": bool(pick("enable_prefix_caching", True)),
        "max_context": pick("max_model_len") or model_max_context(model_path),
        "device": effective.get("device_type"),  # stated once vLLM has started: its device_config
        "attention_backend": _backend(effective.get("attention_backend"), options.engine_args.get("attention_backend")),
    }


def _backend(chosen, asked) -> str | None:
    """The backend name the arms compare ("FLASH_ATTN"): what the config read back names, else
    what the options asked for; "auto" (vLLM's selector, not read back) stays unstated to the check."""
    for value in (chosen, asked):
        name = None if value is None else str(value).split(" (from ")[0].removeprefix("AttentionBackendEnum.")
        if name and name.lower() != "auto":
            return name
    return "auto" if chosen is not None else None


def vllm_serve_settings(argv: list[str]) -> dict:
    """The matched-config facts of a launched `vllm serve` (an openai arm's `serve`), read from
    its flags with vLLM's defaults; {} for a command that is not vLLM (then nothing is assumed)."""
    if not any("vllm" in a for a in argv[:3]):
        return {}

    def flag(name: str) -> str | None:
        for i, a in enumerate(argv):
            if a == name and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(name + "="):
                return a.split("=", 1)[1]
        return None

    kv, util, ctx = flag("--kv-cache-memory-bytes"), flag("--gpu-memory-utilization"), flag("--max-model-len")
    return {
        "dtype": None if flag("--dtype") in (None, "auto") else flag("--dtype"),
        "eager": "--enforce-eager" in argv,
        "kv_cache": f"kv_cache_memory_bytes={kv}" if kv else f"gpu_memory_utilization={util}" if util else None,
        "prefix_cache": "--no-enable-prefix-caching" not in argv,
        "max_context": int(ctx) if ctx and ctx.isdigit() else None,
    }
