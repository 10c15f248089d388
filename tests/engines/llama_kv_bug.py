#!/usr/bin/env python
"""examples/engines/kda_engine.py serving a Llama checkpoint, with the KV-cache bug of
tests/test_localize_decode.py planted: from decode step K on, layer L's cached values (all but
the newest) are zeroed (LLAMA_KV_BUG="L:K"). The example's serving, scoring and dump code is
transformers-generic but for the class it loads, which this wrapper makes AutoModelForCausalLM.
Prefill, score and a prefill dump stay honest; generate and a decode-path dump take the bug."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "engines"))
import kda_engine

transformers.KimiLinearForCausalLM = transformers.AutoModelForCausalLM  # the class kda_engine loads
LAYER, STEP = (int(x) for x in os.environ.get("LLAMA_KV_BUG", "1:2").split(":"))
_init = kda_engine.KDAEngine.__init__


def planted(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    steps = {"n": 0}

    def hook(module, args, kwargs, out):
        cache, x = kwargs.get("past_key_values"), kwargs.get("hidden_states")
        if cache is None or x is None:
            return
        steps["n"] = steps["n"] + 1 if x.shape[1] == 1 else 0  # decode steps since the last prefill
        if steps["n"] >= STEP:
            cache.layers[LAYER].values[:, :, :-1, :] = 0

    self.model.model.layers[LAYER].self_attn.register_forward_hook(hook, with_kwargs=True)


kda_engine.KDAEngine.__init__ = planted

if __name__ == "__main__":
    sys.exit(kda_engine.main())
