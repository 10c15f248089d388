#!/usr/bin/env python
"""examples/engines/kda_engine.py with a planted recurrent-state bug: from decode step K on,
KDA layer L's recurrent state is halved after each update (KDA_STATE_BUG="L:K"). Prefill, score
and a prefill dump stay honest; generate and a decode-path dump take the bug."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "engines"))
import kda_engine

LAYER, STEP = (int(x) for x in os.environ.get("KDA_STATE_BUG", "1:2").split(":"))
_init = kda_engine.KDAEngine.__init__


def planted(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    steps = {"n": 0}

    def hook(module, args, kwargs, out):
        cache, x = kwargs.get("cache_params"), kwargs.get("hidden_states")
        if cache is None or x is None:
            return
        steps["n"] = steps["n"] + 1 if x.shape[1] == 1 else 0  # decode steps since the last prefill
        if steps["n"] >= STEP:
            states = cache.layers[LAYER].recurrent_states
            (states if hasattr(states, "mul_") else states[0]).mul_(0.5)

    self.model.model.layers[LAYER].self_attn.register_forward_hook(hook, with_kwargs=True)


kda_engine.KDAEngine.__init__ = planted

if __name__ == "__main__":
    sys.exit(kda_engine.main())
