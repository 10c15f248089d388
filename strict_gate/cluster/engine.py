"""An arm served by Ray actors: `RayExecuted` is an Engine, so everything that drives an engine
(a gate's arm, `strict-gate run`, gate --resume, the re-scoring) drives a pool of them unchanged.

Prompts are pulled from one queue by the live actors, one prompt per actor at a time (batch 1,
as the gate's own arm runs them), and yielded in the prompt set's order, so the run directory is
written as one engine would write it. An actor that dies (its process, or its node) has its
prompt sent again to another actor and is replaced, while the arm's `retries` allow; every
resend is counted. Which actor served which prompt, on which node, goes into executor.json beside
the run's records; the manifest's engine is the engine's own, plus `executor` (the cluster, the
actor count), so a resumed run is compared with the same engine.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from strict_gate.cluster.actor import EngineHost
from strict_gate.cluster.settings import RaySettings
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import EngineError, MissingExtraError
from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep, write_json_atomic

CLOSE_S = 90.0  # the most the actors' engines get to close (an openai server's stop_timeout_s, then its kill wait)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingExtraError("ray", "ray") from None
    return ray


class RayExecuted(Engine):
    """The arm's engine kind, served by `settings.actors` Ray actors."""

    inner: ClassVar[type[Engine]]
    in_process: ClassVar[bool] = False  # the engines run in the actors; the arm's env goes to them
    writes_log: ClassVar[bool] = True  # for the run directory's path: executor.json goes beside engine.log
    measurable: ClassVar[bool] = False  # the speed arm times one engine, not a pool
    pooled = "served by a pool of Ray actors ([<role>.ray])"

    def __init__(self, options, env: dict[str, str] | None = None, base_dir: str | Path = ".", *,
                 settings: RaySettings):
        super().__init__(options, env, base_dir)
        self.settings = settings
        self.local = self.inner(options, env, base_dir)  # never started: tokenize needs no model
        self.actors: dict[int, Any] = {}  # index -> actor handle, the live ones
        self.hellos: dict[int, dict[str, Any]] = {}
        self.served: dict[str, int] = {}
        self.resent: list[dict[str, Any]] = []
        self.spawned = 0
        self.scored = 0  # score calls so far: the next goes to the next actor
        self.scores: dict[int, int] = {}  # actor index -> score calls it answered (executor.json)
        self.started_ray = False

    # -- lifecycle
    def start(self) -> None:
        if self.actors:
            return
        ray = _ray()
        if not ray.is_initialized():
            _connect(ray, self.settings.cluster(), self.settings.start_timeout_s)
            self.started_ray = True
        self._spawn(self.settings.actors)
        hello = self.hellos[min(self.hellos)]
        self.can_score = bool(hello["can_score"])
        self.servings = frozenset()  # variants drive one engine; a pool serves one prompt per actor

    def _launch(self, n: int) -> dict[int, tuple[Any, Any]]:
        """`n` new actors asked of the cluster: index -> (handle, the ref of its hello)."""
        ray = _ray()
        s = self.settings
        host = ray.remote(EngineHost).options(
            num_cpus=s.num_cpus, num_gpus=s.num_gpus, resources=dict(s.resources) or None, max_restarts=0,
            runtime_env={"env_vars": {**self.env, **s.env}} if (self.env or s.env) else None)
        log_dir = str(Path(self.log_path).parent.resolve()) if self.log_path else None  # an actor has its own cwd
        out = {}
        for _ in range(n):
            handle = host.remote(self.inner.kind, self.options, self.env, str(self.base_dir), log_dir)
            out[self.spawned] = (handle, handle.hello.remote())
            self.spawned += 1
        return out

    def _spawn(self, n: int) -> None:
        """`n` actors, each with its engine started (in parallel), within start_timeout_s."""
        ray = _ray()
        launched = self._launch(n)
        try:
            hellos = ray.get([ref for _, ref in launched.values()], timeout=self.settings.start_timeout_s)
        except Exception as e:
            for handle, _ in launched.values():  # maybe never placed: a close call would wait for room
                ray.kill(handle)
            why = (f"the cluster has no room for them within start_timeout_s = {self.settings.start_timeout_s:g} s "
                   f"({_room(ray, self.settings)})" if isinstance(e, ray.exceptions.GetTimeoutError) else _cause(e))
            raise EngineError(f"{n} Ray actor(s) of the {self.inner.kind} engine did not start: {why}") from None
        for (index, (handle, _)), hello in zip(launched.items(), hellos, strict=True):
            self.hellos[index] = hello
            self.actors[index] = handle

    def close(self) -> None:
        if self.actors:
            _stop(list(self.actors.values()))  # each engine closed in its actor (a launched server stopped)
            self.actors = {}
            self._write_executor()
        if self.started_ray:
            _ray().shutdown()
            self.started_ray = False

    # -- what the manifest says
    def info(self) -> EngineInfo:
        if not self.hellos:
            return self.local.info()
        i: EngineInfo = self.hellos[min(self.hellos)]["info"]
        executor = {"kind": "ray", "cluster": self.settings.cluster(), "actors": self.settings.actors}
        return EngineInfo(i.kind, i.model, {**i.options, "executor": executor}, i.env, i.versions, i.tokenizer)

    def tokenize(self, text: str) -> list[int]:
        return self.local.tokenize(text)

    def tokenizer_file(self) -> Path | None:
        return self.local.tokenizer_file()

    # -- serving
    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        """Every prompt through the pool, yielded in `prompts`' order."""
        ray = _ray()
        queue = deque(enumerate(prompts))
        idle = deque(self.actors)
        flying: dict[Any, tuple[int, int, PromptInput]] = {}
        joining: dict[Any, tuple[int, Any]] = {}  # a replacement's hello ref -> (index, handle)
        done: dict[int, list[Record]] = {}
        tries: dict[str, int] = {}
        nxt = 0
        while queue or flying:
            while idle and queue:
                a = idle.popleft()
                i, p = queue.popleft()
                flying[self.actors[a].generate.remote(p, sampling)] = (a, i, p)
            if not flying:  # every actor lost: only a replacement can go on
                self._await_replacement(joining, idle)
                continue
            (ref,), _ = ray.wait([*flying, *joining], num_returns=1)
            if ref in joining:
                idle.extend(self._joined(ref, joining))
                continue
            a, i, p = flying.pop(ref)
            try:
                done[i] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                joining.update(self._lost(a, p, tries, e))
                queue.appendleft((i, p))
                continue
            except ray.exceptions.RayTaskError as e:
                raise EngineError(f"{self.inner.kind} engine failed on prompt {p.id!r} in Ray actor {a}: "
                                  f"{_cause(e)}") from None
            self.served[p.id] = a
            idle.append(a)
            while nxt in done:
                yield from done.pop(nxt)
                nxt += 1
        for _, handle in joining.values():  # still waiting for room: not needed any more
            ray.kill(handle)

    def _lost(self, a: int, p: PromptInput, tries: dict[str, int], e: Exception) -> dict[Any, tuple[int, Any]]:
        """Actor `a` died serving `p`: forget it, count the resend, ask for a replacement (it joins
        once the cluster has room and its engine started; the live actors go on meanwhile)."""
        self.actors.pop(a, None)
        tries[p.id] = tries.get(p.id, 0) + 1
        self.resent.append({"prompt": p.id, "actor": a, "node": self.hellos[a]["node"], "why": _cause(e)})
        if tries[p.id] > self.settings.retries:
            raise EngineError(f"prompt {p.id!r} lost its Ray actor {tries[p.id]} times (retries = "
                              f"{self.settings.retries}): {_cause(e)}")
        return {ref: (index, handle) for index, (handle, ref) in self._launch(1).items()}

    def _joined(self, ref: Any, joining: dict[Any, tuple[int, Any]]) -> list[int]:
        """A replacement's hello came back: it serves from now on (one that failed to start is dropped)."""
        ray = _ray()
        index, handle = joining.pop(ref)
        try:
            self.hellos[index] = ray.get(ref)
        except Exception:
            ray.kill(handle)
            return []
        self.actors[index] = handle
        return [index]

    def _await_replacement(self, joining: dict[Any, tuple[int, Any]], idle: deque) -> None:
        """No live actor: wait for a replacement, at most start_timeout_s, else the arm fails."""
        ray = _ray()
        ready, _ = ray.wait(list(joining), num_returns=1, timeout=self.settings.start_timeout_s) if joining else ([], [])
        if not ready:
            raise EngineError(f"every Ray actor of the {self.inner.kind} engine was lost and no replacement started "
                              f"within start_timeout_s = {self.settings.start_timeout_s} (no node with room left)")
        idle.extend(self._joined(ready[0], joining))

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        """Re-scoring goes to the actors in turn."""
        ray = _ray()
        a = sorted(self.actors)[self.scored % len(self.actors)]
        self.scored += 1
        self.scores[a] = self.scores.get(a, 0) + 1
        return ray.get(self.actors[a].score.remote(list(prompt_ids), list(continuation_ids), k))

    def _write_executor(self) -> None:
        """executor.json beside the run: the cluster, each actor's node and the GPUs Ray gave it (ids,
        CUDA_VISIBLE_DEVICES), who served what, what was resent."""
        if not self.log_path:
            return
        body = {"schema": "strict-gate/executor@1", "kind": "ray", "cluster": self.settings.cluster(),
                "actors": [{"index": i, "node": h["node"], "host": h["host"], "pid": h["pid"],
                            "gpu_ids": h.get("gpu_ids"), "cuda_visible_devices": h.get("cuda_visible_devices")}
                           for i, h in sorted(self.hellos.items())],
                "nodes": sorted({h["node"] for h in self.hellos.values()}),
                "served": self.served, "scored": {str(a): n for a, n in sorted(self.scores.items())},
                "resent": self.resent}
        write_json_atomic(Path(self.log_path).parent / "executor.json", body)


def _connect(ray: Any, address: str, timeout_s: float) -> None:
    """ray.init, bounded: an address where nothing listens is refused at once, and one that does
    not answer as a cluster within `timeout_s` fails the arm (ray.init alone retries for minutes)."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if address != "auto" and host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=min(timeout_s, 10.0)).close()
        except OSError as e:
            raise EngineError(f"the Ray cluster at {address!r} does not answer ({e}): start it (`ray start --head`) "
                              "or fix [<role>.ray] address") from None
    failed: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except BaseException as e:  # handed to the caller's thread
            failed.append(e)

    t = threading.Thread(target=init, name="ray-init", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise EngineError(f"the Ray cluster at {address!r} did not answer within start_timeout_s = {timeout_s:g} s")
    if failed:
        raise EngineError(f"cannot connect to the Ray cluster at {address!r}: {_cause(failed[0])}")


def _stop(handles: list[Any]) -> None:
    """Each actor's engine closed in its actor (a launched server stopped as a group, a command
    engine's process), at most CLOSE_S, then the actor killed; one already dead is only killed."""
    ray = _ray()
    refs = [h.close.remote() for h in handles]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=CLOSE_S)
    for h in handles:
        ray.kill(h)


def _room(ray: Any, s: RaySettings) -> str:
    """What each actor asks against what the cluster has in all, for a start that found no room."""
    ask = {"CPU": s.num_cpus, "GPU": s.num_gpus, **s.resources}
    try:
        have = ray.cluster_resources()
    except Exception:
        have = {}
    return "each asks " + ", ".join(f"{k} {v:g}" for k, v in ask.items() if v) + "; the cluster has " + \
        ", ".join(f"{k} {have.get(k, 0):g}" for k, v in ask.items() if v) + " in all"


def _cause(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__


def ray_engine_class(inner: type[Engine]) -> type[RayExecuted]:
    """`inner`'s kind served by Ray actors: the same kind and Options, so configs, manifests and
    resume see the engine they expect."""
    return type(f"Ray{inner.__name__}", (RayExecuted,), {"kind": inner.kind, "Options": inner.Options,
                                                          "inner": inner})


IN_DRIVER = {"kind": "driver", "pooled": False, "note": "not pooled: ran in the driver process"}


def driver_engine_class(inner: type[Engine]) -> type[Engine]:
    """`inner`'s kind run in the driver (the gate's own process), for what drives one engine of a
    Ray arm (invariance variants: a batch or concurrency variant is one engine serving several
    sequences at once, which a pool of batch-1 actors is not); its manifests say so under
    `options.executor`."""

    def info(self) -> EngineInfo:
        i: EngineInfo = inner.info(self)
        return EngineInfo(i.kind, i.model, {**i.options, "executor": dict(IN_DRIVER)}, i.env, i.versions, i.tokenizer)

    return type(f"Driver{inner.__name__}", (inner,), {"info": info})


__all__ = ["IN_DRIVER", "RayExecuted", "driver_engine_class", "ray_engine_class"]
