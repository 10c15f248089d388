"""The Ray actor that holds one engine: built and started in the actor's own process (on whatever
node Ray placed it), then asked for one prompt at a time, so a record equals what the engine
gives alone at batch 1. Ray is imported only here and in cluster/engine.py, when an arm asks for it."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from strict_gate.engines import engine_class
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.runs.records import Record, Sampling, Timing


class EngineHost:
    """One engine in one actor. Its methods return plain values (records, infos): Ray pickles them."""

    def __init__(self, kind: str, options: Any, env: dict[str, str], base_dir: str, log_dir: str | None):
        self.engine: Engine = engine_class(kind)(options, env, Path(base_dir))
        if log_dir is not None and self.engine.writes_log:
            self.engine.set_log_path(Path(log_dir) / f"engine-{os.getpid()}.log")
        with self.engine.scoped_env():
            self.engine.start()

    def hello(self) -> dict[str, Any]:
        """Who serves: the engine's info, the capabilities it narrowed at start, where it runs, and the
        GPUs Ray gave it (its ids on the node, and the CUDA_VISIBLE_DEVICES Ray set for them)."""
        import ray

        e = self.engine
        return {"info": e.info(), "node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "can_score": e.can_score, "servings": sorted(str(s) for s in e.servings)}

    def generate(self, prompt: PromptInput, sampling: Sampling) -> list[Record]:
        """One prompt alone; the wall clock filled in where the engine gave none (as gate/arm.py does)."""
        t0 = time.perf_counter()
        with self.engine.scoped_env():
            records = list(self.engine.generate([prompt], sampling))
        dt = time.perf_counter() - t0
        return [r if r.error is not None or (r.timing and r.timing.total_s is not None) or self.engine.replays_run
                else _with_total(r, dt) for r in records]

    def score(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list:
        with self.engine.scoped_env():
            return self.engine.score(prompt_ids, continuation_ids, k)

    def close(self) -> None:
        self.engine.close()


def _with_total(r: Record, seconds: float) -> Record:
    return replace(r, timing=Timing(ttft_s=r.timing.ttft_s if r.timing else None, total_s=seconds))

