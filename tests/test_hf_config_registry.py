"""The hf engine builds its model from transformers' own config class, whatever another library
registered under the same model_type in this process. vLLM does that (AutoConfig.register, e.g. its
KimiLinearConfig for kimi_linear) once it has run in-process; on the H200 a Kimi gate's hf arm,
restarted after the in-process vLLM reference, failed with "'KimiLinearConfig' object has no
attribute 'num_local_experts'". Here the registration is planted (a real vLLM run needs its Kimi
kernels, CUDA only): a stand-in class under "llama", as vLLM's registry would leave it."""

from __future__ import annotations

from conftest import need

need("transformers")


def test_a_config_class_registered_over_transformers_own_does_not_reach_the_model(monkeypatch):
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from strict_gate.engines.hf import HFEngine, HFOptions

    class Foreign(transformers.PretrainedConfig):  # what a library's own config for the type looks like
        model_type = "llama"

    monkeypatch.setitem(CONFIG_MAPPING._extra_content, "llama", Foreign)
    assert type(transformers.AutoConfig.from_pretrained(HFEngine(HFOptions(model="bundled:tiny-llama")).model_path)) \
        is Foreign  # the planted registration is what AutoConfig now reads
    eng = HFEngine(HFOptions(model="bundled:tiny-llama"))
    try:
        eng.start()
        assert type(eng._model.config) is transformers.LlamaConfig
        ids = eng.tokenize("Hello")
        steps = eng.score(ids, ids[:2], 2)
        assert len(steps) == 2
    finally:
        eng.close()


def test_remote_code_is_left_to_transformers(tmp_path):
    from strict_gate.engines.hf import _transformers_config

    assert _transformers_config(str(tmp_path), True) is None  # reads no file: AutoModel decides
