#!/usr/bin/env python
"""examples/engines/kda_engine.py with a planted state-carry bug at the KDA chunk boundary
(KDA_CHUNK_STATE_BUG=drop|double; unset, empty or "off": the honest engine).

In the multi-token KDA pass (the chunked form: prefill, score, a prefill_chunk piece) every
recurrent state handed over is dropped (zeros) or doubled: the state one 64-token chunk hands the
next, and the state a cut prefill hands its next piece from the cache. So a prompt longer than 64
tokens is computed wrongly from token 64 on, a prompt of at most 64 tokens is not, and every cut
of an invariance variant hands a wrong state. Decode (the recurrent form) stays honest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "engines"))
import kda_engine

MODE = os.environ.get("KDA_CHUNK_STATE_BUG", "off").strip().lower() or "off"
if MODE not in ("off", "drop", "double"):
    raise SystemExit(f"KDA_CHUNK_STATE_BUG={MODE!r}: expected drop, double or off")


def carry(state):
    """The bug: the state as handed across a boundary."""
    return state.mul(0) if MODE == "drop" else state.mul(2)


def planted(chunk_fn):
    """chunk_fn run one chunk at a time, the state between chunks (and from the cache) carried wrong."""
    import torch

    def kda_pass(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False, **kw):
        state = None if initial_state is None else carry(initial_state)
        outs = []
        for s in range(0, query.shape[1], chunk_size):
            piece = [x[:, s : s + chunk_size] for x in (query, key, value, g, beta)]
            o, state = chunk_fn(*piece[:3], g=piece[3], beta=piece[4], chunk_size=chunk_size,
                                initial_state=state if s == 0 else carry(state), output_final_state=True, **kw)
            outs.append(o)
        return torch.cat(outs, dim=1), state if output_final_state else None

    return kda_pass


if __name__ == "__main__":
    if MODE != "off":
        from transformers.models.kimi_linear import modeling_kimi_linear as mkl

        mkl.chunk_kimi_delta_attention = planted(mkl.chunk_kimi_delta_attention)  # kda_engine wraps this one
    sys.exit(kda_engine.main())
