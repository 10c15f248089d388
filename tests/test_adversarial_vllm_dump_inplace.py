"""vLLM's dump reads modules that write their output in place (issue 35: vLLM 0.26's Kimi-Linear).

vLLM's KimiDecoderLayer calls `self.self_attn(hidden_states=..., positions=..., output=buf)`: the
KDA and MLA attentions fill `buf` and return None, so a hook reading the return value had nothing
to keep. The modules below are real torch modules shaped as vLLM's Kimi-Linear (a decoder layer
returning (hidden, residual), a fused norm returning a pair); `LLM` is a stand-in with vLLM's
apply_model / generate calls, since vLLM's Kimi-Linear needs CUDA (its KDA Triton kernels) and
this machine has none: the real run is benchmarks/gpu_vllm (run.sh kimilocal).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from strict_gate.engines.base import DumpRequest
from strict_gate.engines.vllm.dump import collect, install, run
from strict_gate.errors import EngineError

H = 4


class InPlaceAttention(torch.nn.Module):
    """Kimi-Linear's attention in vLLM: fills `output`, returns None."""

    def __init__(self, fills: bool = True):
        super().__init__()
        self.proj, self.fills = torch.nn.Linear(H, H), fills

    def forward(self, hidden_states, positions, output):
        if self.fills:
            output[:] = self.proj(hidden_states) * 2


class Layer(torch.nn.Module):
    def __init__(self, fills: bool = True):
        super().__init__()
        self.self_attn, self.mlp = InPlaceAttention(fills), torch.nn.Linear(H, H)

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else hidden_states + residual
        buf = torch.empty_like(hidden_states)
        self.self_attn(hidden_states=hidden_states, positions=positions, output=buf)
        return self.mlp(buf), residual


class Norm(torch.nn.Module):
    def forward(self, x, residual):
        return x + residual, x + residual


class Model(torch.nn.Module):
    def __init__(self, fills: bool = True):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(32, H)
        self.layers = torch.nn.ModuleList([Layer(fills), Layer(fills)])
        self.norm = Norm()

    def forward(self, ids):
        h, residual = self.embed_tokens(ids), None
        for layer in self.layers:
            h, residual = layer(None, h, residual)
        return self.norm(h, residual)[0]


def test_an_attention_that_fills_its_output_argument_is_dumped_from_that_tensor():
    torch.manual_seed(0)
    model = SimpleNamespace(model=Model())
    chosen = install(model, None)
    assert "layers.0.attn" in chosen and "layers.1.attn" in chosen
    ids = torch.tensor([1, 2, 3])
    with torch.no_grad():
        model.model(ids)
        h = model.model.embed_tokens(ids)
        want = model.model.layers[0].self_attn.proj(h) * 2  # what layer 0's attention wrote
    rows = collect(model)
    assert torch.allclose(rows["layers.0.attn"], want)
    assert rows["layers.0"].shape == (3, H) and rows["norm"].shape == (3, H)


def _llm(model):
    """vLLM's LLM as the dump calls it: apply_model runs the function on the worker's model; generate
    runs the forward pass (here the ids themselves) and returns one output."""
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7])])

    def generate(prompts, params, use_tqdm=False):
        with torch.no_grad():
            model.model(torch.tensor(prompts[0]["prompt_token_ids"]))
        return [out]

    return SimpleNamespace(apply_model=lambda fn: [fn(model)], generate=generate)


def test_the_dump_through_run_keeps_the_in_place_attention_rows():
    pytest.importorskip("vllm")
    model = SimpleNamespace(model=Model())
    kept = run(_llm(model), DumpRequest((1, 2, 3, 4), None, (2, 3), Path("d")))
    assert kept["layers.1.attn"].shape == (2, H)
    assert float(kept["layers.1.attn"].abs().sum()) > 0


def test_a_module_that_returns_nothing_and_fills_nothing_is_refused_by_name():
    pytest.importorskip("vllm")
    model = SimpleNamespace(model=Model(fills=False))

    class Silent(torch.nn.Module):  # returns None and is handed no output tensor
        def forward(self, x):
            return None

    for layer in model.model.layers:
        layer.self_attn = Silent()
        layer.forward = lambda positions, h, residual, layer=layer: (layer.mlp(layer.self_attn(h) or h), h)
    with pytest.raises(EngineError, match=r"dump of layers\.0\.attn, layers\.1\.attn: no rows \(the module returned nothing"):
        run(_llm(model), DumpRequest((1, 2, 3), None, (1, 2), Path("d")))
