"""The openai arm's options (`kind = "openai"`) and their check when the config is read, apart
from the engine that sends the requests (engines/openai/engine.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from strict_gate.core.options import Bound, Checked, NonEmptyList, PositiveInt, Seconds
from strict_gate.engines.openai.server import url_problems
from strict_gate.errors import ConfigError

Retries = Annotated[int, Bound(ge=0, le=10)]


@dataclass(frozen=True)
class OpenAIOptions(Checked):
    base_url: str | list[str] | None = None  # http://127.0.0.1:8000 (a trailing /v1 is accepted), or a list
    model: str | None = None  # the served model name; None: the first of GET /v1/models
    api_key_env: str | None = None  # NAME of the env var that holds the key (never the key)
    serve: NonEmptyList | None = None  # command that launches the server (argv, no shell)
    servers: PositiveInt = 1  # copies of `serve` to launch, each on its own {port}
    health_url: str | None = None  # default: base_url/health, then base_url/v1/models
    startup_timeout_s: Seconds = 600.0
    request_timeout_s: Seconds = 120.0
    retries: Retries = 2  # extra attempts after a connection error or a 5xx (never after a 4xx)
    tokenizer: str | None = None  # tokenizer.json or a model dir; None: the server's /tokenize
    prompt_logprobs: bool = True  # teacher-forced scoring through prompt_logprobs
    stream_timing: bool = False  # stream each request to measure time to first token
    # Merged into every completion request over the neutral settings (top_p 1, presence and
    # frequency penalties 0, repetition_penalty 1: vLLM's server otherwise takes defaults such as
    # a repetition penalty from the model's generation_config). A key set to null is not sent.
    extra_body: dict = field(default_factory=dict)
    stop_timeout_s: Seconds = 30.0  # SIGTERM grace period before SIGKILL
    # A server that answers only text (no token ids, no logprobs): prompts are sent as text and
    # the reply is tokenized in context with `tokenizer` (required); engines/openai/text_only.py.
    text_only: bool = False


def check_openai_options(options: OpenAIOptions, *, where: str, line_of) -> None:
    """A base_url or health_url holding credentials is refused when the config is read, before anything is
    written (the refusal does not repeat them)."""
    for name, problem in url_problems(options):
        raise ConfigError(f"[{where}] {problem}", path=getattr(line_of, "path", None), line=line_of(name))
    if options.text_only and not options.tokenizer:
        raise ConfigError(
            f"[{where}] text_only = true needs tokenizer (a tokenizer.json or the model directory): the "
            "server's text is tokenized with it, in context", path=getattr(line_of, "path", None),
            line=line_of("text_only"))


def connect_mode_refusal(options: OpenAIOptions) -> str | None:
    """Why this arm cannot be served by Ray actors ([<role>.ray]), None when it can: a launched
    arm can (each actor launches its own server and stops it when it stops); connect mode cannot."""
    if options.serve:
        return None
    return ("connect mode is not pooled: the servers at base_url are already where they are, and a Ray actor "
            "would only relay their requests; spread the prompts over several running servers with the openai "
            "arm's own list, base_url = [\"http://host-1:8000\", \"http://host-2:8000\"] (or give serve = [...] "
            "so that each actor launches its own server)")
