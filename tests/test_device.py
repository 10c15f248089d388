"""The device an in-process engine computed on, in its manifest: the type always where known, a
GPU's name, capability, driver and CUDA versions where they can be read, never a failure."""

from __future__ import annotations

from types import SimpleNamespace

from strict_gate.engines import device
from strict_gate.engines.device import device_facts, device_type
from strict_gate.engines.vllm.engine import _attention_backend, _layer_backends, _read_backends


def test_device_type_and_facts_never_fail(monkeypatch):
    assert device_type("cuda:1") == "cuda" and device_type(None) is None and device_type("") is None
    assert device_facts(None) == {} and device_facts("cpu") == {"type": "cpu"}
    monkeypatch.setattr(device.shutil, "which", lambda _: None)  # no nvidia-smi here: the driver is unstated
    monkeypatch.setattr(device, "_gpu_facts", lambda _: {})  # a torch without CUDA: nothing more is claimed
    assert device_facts("cuda:0") == {"type": "cuda"}


def test_a_gpu_is_described_from_torch_and_nvidia_smi(monkeypatch):
    """torch.cuda and nvidia-smi are the real sources on a GPU machine; on this CPU one they are
    stood in for (there is no GPU to ask)."""
    monkeypatch.setattr(device, "_gpu_facts", lambda i: {"gpu_name": f"NVIDIA H200 #{i}", "compute_capability": "9.0",
                                                         "cuda_version": "13.0"})
    monkeypatch.setattr(device, "_driver_version", lambda: "580.95.05")
    assert device_facts("cuda:1") == {"type": "cuda", "gpu_name": "NVIDIA H200 #1", "compute_capability": "9.0",
                                      "cuda_version": "13.0", "driver_version": "580.95.05"}


def test_the_attention_backend_is_read_back_else_the_variable_else_auto(monkeypatch):
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    chosen = SimpleNamespace(attention_config=SimpleNamespace(backend="FLASH_ATTN"))
    assert _attention_backend(chosen, {}) == "FLASH_ATTN"
    assert _attention_backend(SimpleNamespace(), {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}) == \
        "TRITON_ATTN (from VLLM_ATTENTION_BACKEND)"
    assert _attention_backend(SimpleNamespace(attention_config=SimpleNamespace(backend=None)), {}) == "auto"
    assert _attention_backend(chosen, {}, ["FLASH_ATTN", "TRITON_ATTN"]) == "FLASH_ATTN+TRITON_ATTN"


def test_the_workers_backends_are_read_only_where_apply_model_may_pickle(monkeypatch):
    """A stand-in for vLLM's LLM (its apply_model runs the function on each worker's model): the
    layers' backends are read back with VLLM_ALLOW_INSECURE_SERIALIZATION=1 and not asked for without it."""
    class Backend:
        def __init__(self, name):
            self.name = name

        def get_name(self):
            return self.name

    layers = [SimpleNamespace(attn_backend=Backend("FLASH_ATTN")), SimpleNamespace(attn_backend=Backend("FLASH_ATTN")),
              SimpleNamespace(attn_backend=None), SimpleNamespace()]
    model = SimpleNamespace(modules=lambda: iter(layers))
    asked = []
    llm = SimpleNamespace(apply_model=lambda fn: asked.append(fn) or [fn(model)])
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    assert _read_backends(llm) is None and asked == []
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    assert _read_backends(llm) == ["FLASH_ATTN"] and _layer_backends(model) == ["FLASH_ATTN"]
    broken = SimpleNamespace(apply_model=lambda fn: (_ for _ in ()).throw(RuntimeError("worker gone")))
    assert _read_backends(broken) is None


def test_the_hf_manifest_states_its_device():
    from strict_gate.engines.hf import HFEngine, HFOptions

    info = HFEngine(HFOptions(model="bundled:tiny-llama")).info()  # not started: nothing is loaded for this
    assert info.options["device_info"] == {"type": "cpu"} and info.options["device"] == "cpu"
