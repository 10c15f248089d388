"""transformers, in process: greedy with logprobs from the raw logits in float32.

One prompt per forward pass by default: batching pads and re-orders reductions, which
shows up as false divergence. `prefill_chunk = N` (the invariance variants' with_prefill_chunk)
prefills each prompt N tokens at a time through the model's cache, one prompt at a time
(hf_chunked.py); the run's manifest records it among the options. torch and transformers are
imported in start(), not here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from strict_gate.core.model_files import (
    find_tokenizer_json,
    model_digest,
    model_max_context,
    model_source,
    portable_model_ref,
    resolve_model,
)
from strict_gate.core.options import Checked, Device, NonNegativeInt, PositiveInt
from strict_gate.engines.base import (
    DumpReply,
    DumpRequest,
    Engine,
    PromptInput,
    Serving,
    greedy_finish_reason,
    over_context,
)
from strict_gate.engines.device import device_facts, device_type
from strict_gate.errors import ConfigError, EngineError, MissingExtraError
from strict_gate.runs.records import EngineInfo, Record, Sampling, ScoredStep, Timing, sort_topk

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


# the weights' dtype (auto: the model's own); float64 for a [golden] arm (docs/golden.md), which
# vLLM does not run, so it is transformers' own and not core/options.py's DType
HFDType = Literal["float32", "bfloat16", "float16", "float64", "auto"]


@dataclass(frozen=True)
class HFOptions(Checked):
    model: str
    dtype: HFDType = "float32"
    device: Device = "cpu"
    batch: PositiveInt = 1
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    threads: PositiveInt | None = None
    prefill_chunk: NonNegativeInt = 0  # prompt tokens per prefill forward; 0: the whole prompt in one


class HFEngine(Engine):
    kind = "hf"
    Options = HFOptions
    can_score = True
    can_batch = True  # left-padded batches (the speed arm's concurrency rungs)
    can_dump = True  # forward hooks on the named modules (strict_gate/engines/torch_dump.py)
    can_graft = True
    can_dump_decode = True  # a prefill, then one id at a time with past key values (torch_dump._passes)
    can_graft_ops = True  # op points fed where the next op reads them, either path (torch_graft.py)
    # one padded generate(); a chunked prefill by hand (hf_chunked.py); no prefix cache
    servings = frozenset({Serving.BATCH, Serving.CHUNKED_PREFILL})
    log_libraries = ("transformers",)

    def __init__(self, options: HFOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        self.model_path = resolve_model(options.model, self.base_dir)
        self._tok: PreTrainedTokenizerBase | None = None
        # torch and the model are imported and loaded by start() (never at import: --help stays light);
        # torch's and transformers' stubs are partial, so these stay unchecked
        self._model: Any = None
        self._torch: Any = None

    # -- loading
    def _tokenizer(self):
        if self._tok is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise MissingExtraError("transformers", "hf") from None
            try:
                self._tok = AutoTokenizer.from_pretrained(
                    self.model_path, trust_remote_code=self.options.trust_remote_code
                )
            except OSError as e:
                raise ConfigError(f"hf: cannot load the tokenizer of {self.model_path!r}: {e}") from None
        return self._tok

    def start(self) -> None:
        if self._model is not None:
            return
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise MissingExtraError("torch and transformers", "hf") from None
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the gate draws its own progress
        self._torch = torch
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        dtype = "auto" if self.options.dtype == "auto" else getattr(torch, self.options.dtype)
        kwargs = {"dtype": dtype, "trust_remote_code": self.options.trust_remote_code}
        if self.options.attn_implementation:
            kwargs["attn_implementation"] = self.options.attn_implementation
        if self.options.dtype == "float64":
            kwargs["experts_implementation"] = "eager"  # grouped_mm, the MoE default (Kimi-Linear), takes no float64
        try:
            config = _transformers_config(self.model_path, self.options.trust_remote_code)
            if config is not None:
                kwargs["config"] = config
            model = AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs)
        except OSError as e:
            raise ConfigError(f"hf: cannot load model {self.model_path!r}: {e}") from None
        self._model = model.to(self.options.device).eval()
        self._tokenizer()

    def close(self) -> None:
        self._model = None

    # -- protocol
    def info(self) -> EngineInfo:
        versions = {}
        try:
            import torch
            import transformers

            versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        except ImportError:
            pass
        return EngineInfo(
            kind=self.kind,
            model=self.options.model,
            options=asdict(self.options) | {"resolved_model": self.model_path, "model_digest": model_digest(self.model_path),
                                            "device_info": device_facts(self.options.device),
                                            "model_source": model_source(self.model_path)},
            env=self.env,
            versions=versions,
            tokenizer=portable_model_ref(self.options.model, self.model_path),
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self._tokenizer()(text).input_ids)

    def tokenizer_file(self) -> Path | None:
        return find_tokenizer_json(self.model_path, self.base_dir)

    def _eos_ids(self) -> set[int]:
        cfg = self._model.generation_config
        eos = cfg.eos_token_id if cfg.eos_token_id is not None else self._model.config.eos_token_id
        if eos is None:
            return set()
        return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        self.start()
        bs = self.options.batch
        for i in range(0, len(prompts), bs):
            yield from self._generate_batch(prompts[i : i + bs], sampling)

    def _generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        from transformers import GenerationConfig
        from transformers.generation.streamers import BaseStreamer

        context = model_max_context(self.model_path)
        fitting = []
        for p in prompts:  # one forward past the context could hold the gate for hours, deaf to signals
            refused = over_context(p, sampling, context)
            if refused is None:
                fitting.append(p)
            else:
                yield refused
        if not fitting:
            return
        prompts = fitting
        torch, model = self._torch, self._model
        eos = self._eos_ids()
        if self.options.prefill_chunk:  # one prompt at a time, whatever the batch
            from strict_gate.engines.hf_chunked import chunked_record

            for p in prompts:
                yield chunked_record(torch, model, p, sampling, self.options.prefill_chunk, eos)
            return
        pad = self._tokenizer().pad_token_id
        if pad is None:
            pad = next(iter(eos), 0)
        width = max(len(p.token_ids) for p in prompts)
        # Left padding (only when batch > 1) keeps every prompt's last token at the same column.
        ids = torch.tensor([[pad] * (width - len(p.token_ids)) + list(p.token_ids) for p in prompts])
        mask = torch.tensor([[0] * (width - len(p.token_ids)) + [1] * len(p.token_ids) for p in prompts])
        gen_cfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_tokens,
            # ignore_eos: EOS is masked until max_tokens (logits are read before processors)
            min_new_tokens=sampling.max_tokens if sampling.ignore_eos else None,
            eos_token_id=sorted(eos) or None,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )

        class _FirstToken(BaseStreamer):
            """Times the first generated token (put() is called with the prompt first)."""

            def __init__(self):
                self.calls, self.first = 0, None

            def put(self, value):
                self.calls += 1
                if self.calls == 2 and self.first is None:
                    self.first = time.perf_counter()

            def end(self):
                pass

        streamer = _FirstToken() if len(prompts) == 1 else None
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids.to(model.device),
                    attention_mask=mask.to(model.device),
                    generation_config=gen_cfg,
                    streamer=streamer,
                )
        except Exception as e:  # a forward failure is this prompt's, not the gate's
            for p in prompts:
                yield Record(id=p.id, prompt_token_ids=p.token_ids, error=f"{type(e).__name__}: {e}")
            return
        total = time.perf_counter() - t0
        k = sampling.top_logprobs
        gen = out.sequences[:, width:]
        # logits[step] is (batch, vocab) before any logits processor: the raw distribution.
        # All steps in one log_softmax/topk/gather and one copy to the host each, not one
        # kernel launch and one device sync per step. Row for row the same kernels: the same values.
        lps = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # (batch, steps, vocab)
        chosen = lps.gather(-1, gen.unsqueeze(-1)).squeeze(-1).tolist()
        top = torch.topk(lps, k, dim=-1) if k > 0 else None
        top_ids = top.indices.tolist() if top is not None else None
        top_lps = top.values.tolist() if top is not None else None
        seqs = gen.tolist()
        for b, p in enumerate(prompts):
            toks: list[int] = []
            for t in seqs[b]:
                toks.append(t)
                if t in eos:
                    break
            steps = []
            for s, tok in enumerate(toks):
                if top is None:
                    pairs = [(tok, chosen[b][s])]
                else:
                    assert top_ids is not None and top_lps is not None  # set with top
                    pairs = list(zip(top_ids[b][s], top_lps[b][s]))
                    if tok not in top_ids[b][s]:
                        pairs.append((tok, chosen[b][s]))
                steps.append(sort_topk(pairs))
            ttft = (streamer.first - t0) if streamer is not None and streamer.first else None
            yield Record(
                id=p.id,
                prompt_token_ids=p.token_ids,
                token_ids=tuple(toks),
                finish_reason=greedy_finish_reason(toks, eos),
                top_logprobs=tuple(steps),
                timing=Timing(ttft_s=ttft, total_s=total if len(prompts) == 1 else None),
            )

    def generate_batch(self, prompts: Sequence[PromptInput], sampling: Sampling) -> list[Record]:
        self.start()
        return list(self._generate_batch(prompts, sampling))

    def with_prefill_chunk(self, chunk: int) -> HFEngine:
        """The same model, prefilled `chunk` tokens per forward through its cache (0: whole)."""
        return HFEngine(replace(self.options, prefill_chunk=chunk), self.env, self.base_dir)

    def speed_settings(self) -> dict:
        """transformers has no CUDA graphs or compile here: eager. Its KV cache grows as needed,
        so it has no KV-cache setting to compare (left unknown). The attention implementation is
        the loaded model's (transformers picks sdpa or eager), else the option, else unstated."""
        loaded = getattr(getattr(self._model, "config", None), "_attn_implementation", None)
        return {"dtype": self.options.dtype, "eager": True, "prefix_cache": False,
                "max_context": model_max_context(self.model_path),
                "device": device_type(self.options.device),
                "attention_backend": loaded or self.options.attn_implementation}

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], k: int) -> list[ScoredStep]:
        """One forward pass over prompt + continuation; position i scores continuation[i]."""
        self.start()
        torch, model = self._torch, self._model
        if not continuation_ids:
            return []
        ids = torch.tensor([list(prompt_ids) + list(continuation_ids)], device=model.device)
        try:
            with torch.inference_mode():
                logits = model(input_ids=ids).logits[0]
            logits = logits if logits.dtype == torch.float64 else logits.float()  # a float64 golden stays float64
        except Exception as e:
            raise EngineError(f"hf: scoring failed: {type(e).__name__}: {e}") from None
        n = len(prompt_ids)
        lps = torch.log_softmax(logits[n - 1 : n - 1 + len(continuation_ids)], dim=-1)
        top = torch.topk(lps, k, dim=-1)
        out = []
        for i, tok in enumerate(continuation_ids):
            pairs = list(zip(top.indices[i].tolist(), top.values[i].tolist()))
            out.append(ScoredStep(token_id=int(tok), logprob=float(lps[i, tok]), top=sort_topk(pairs)))
        return out

    def dump(self, request: DumpRequest) -> DumpReply:
        """Activations at the canonical points: transformers' module names are the canonical ones."""
        from strict_gate.engines.torch_dump import dump_hf_model

        self.start()
        try:
            return dump_hf_model(self._torch, self._model, request)
        except EngineError:
            raise
        except Exception as e:
            raise EngineError(f"hf: dump failed: {type(e).__name__}: {e}") from None


def _transformers_config(path: str, trust_remote_code: bool):
    """The checkpoint's config read by transformers' own class for its model_type, or None (remote
    code, or a type transformers does not know: AutoModel decides as ever). vLLM, once it has run in
    this process, registers its own config classes under the same names (AutoConfig.register: its
    KimiLinearConfig for kimi_linear, say), and transformers' modelling code cannot read those: a gate's
    hf arm restarted after an in-process vLLM reference failed with "'KimiLinearConfig' object has no
    attribute 'num_local_experts'"."""
    if trust_remote_code:
        return None
    import transformers
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    values, _ = PretrainedConfig.get_config_dict(path)
    name = CONFIG_MAPPING_NAMES.get(str(values.get("model_type")))
    cls = getattr(transformers, name, None) if name else None
    return cls.from_pretrained(path) if cls is not None else None
