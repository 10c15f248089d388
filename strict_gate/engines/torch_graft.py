"""Grafting in a transformers model: feed the reference's values in place of the model's own.

A graft file holds the reference's points at every position (docs/engine-protocol.md, "dump").
`embed` and `layers.{i}` are layer inputs: `embed` replaces layer 0's input and `layers.{i-1}`
layer i's. An op point (`graft_ops`: `layers.{i}.attn_norm`, `.attn.q_proj`, `.attn.core`,
`.mlp.act`, ...) replaces the model's own value of that point where the next op reads it: an
output point through a forward hook that returns the reference's tensor, an input point
(`attn.core`, `mlp.act`: a projection's input) through a forward pre-hook. The dump's hooks are
registered first, so a dumped point is still the model's own computation, fed the reference's
inputs. Each feeding hook keeps a cursor over the positions it has fed, so a prefill pass takes
its rows and each decode pass the next one: grafting works along the decode path too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from strict_gate.errors import EngineError


def graft_inputs(path: Path, n: int) -> dict[str, Any]:
    """The reference's points (every position), read from the graft file."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    for name, t in tensors.items():
        if t.dim() != 2 or t.shape[0] != n:
            raise EngineError(f"graft file {path}: {name} has shape {tuple(t.shape)}, expected ({n}, width)")
    return tensors


class _Rows:
    """The next rows of a (positions x width) tensor, as a module's tensor of `like`'s shape."""

    def __init__(self, name: str, tensor: Any):
        self.name, self.tensor, self.at = name, tensor, 0

    def next(self, like: Any) -> Any:
        n = like.shape[1]
        rows = self.tensor[self.at: self.at + n]
        self.at += n
        if rows.shape[0] != n or rows.numel() != like[0].numel():
            raise EngineError(f"graft: {self.name} cannot feed a tensor of shape {tuple(like.shape)} "
                              f"(rows {self.at - n}..{self.at} of {tuple(self.tensor.shape)})")
        return rows.to(dtype=like.dtype, device=like.device).reshape(like.shape)


def _layer_feed(rows: _Rows) -> Callable:
    def pre(module, args, kwargs):
        if args:
            return (rows.next(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": rows.next(kwargs["hidden_states"])}

    return pre


def _input_feed(rows: _Rows) -> Callable:
    def pre(module, args):
        return (rows.next(args[0]), *args[1:])

    return pre


def _output_feed(rows: _Rows) -> Callable:
    def hook(module, args, out):
        if isinstance(out, tuple):
            return (rows.next(out[0]), *out[1:])
        return rows.next(out)

    return hook


def graft_hooks(path: Path, n: int, layers: dict[str, Any], ops: dict[str, tuple[Any, bool]]) -> list:
    """The feeding hooks for a graft file over n ids; `layers`: `layers.{i}` -> decoder layer,
    `ops`: op point -> (module, the point is the module's input). A point the model has no place
    for (an op it does not have) is not fed and not guessed."""
    inputs = graft_inputs(path, n)
    hooks = []
    for i, point in enumerate(p for p in layers if p.count(".") == 1):
        source = "embed" if i == 0 else f"layers.{i - 1}"
        if source in inputs:
            hooks.append(layers[point].register_forward_pre_hook(_layer_feed(_Rows(source, inputs[source])),
                                                                  with_kwargs=True))
    for name, tensor in inputs.items():
        if name in ops:
            module, is_input = ops[name]
            rows = _Rows(name, tensor)
            hooks.append(module.register_forward_pre_hook(_input_feed(rows)) if is_input
                         else module.register_forward_hook(_output_feed(rows)))
    return hooks
