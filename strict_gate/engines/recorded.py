"""Replays a stored run (a committed baseline or another engine's output): no model loaded.

This is how a nightly gate compares against vLLM's goldens without starting vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from strict_gate.core.options import Checked
from strict_gate.engines.base import Engine, PromptInput
from strict_gate.errors import ConfigError
from strict_gate.runs.reader import load_run
from strict_gate.runs.records import EngineInfo, Record, Run, Sampling


@dataclass(frozen=True)
class RecordedOptions(Checked):
    path: str
    model: str | None = None  # when set, the baseline must have been captured from this model


class RecordedEngine(Engine):
    kind = "recorded"
    Options = RecordedOptions
    in_process = True
    replays_run = True
    measurable = False  # a stored run has no speed (the [speed] rule in config.py)

    def __init__(self, options: RecordedOptions, env=None, base_dir="."):
        super().__init__(options, env, base_dir)
        p = self.base_dir / options.path
        self.path = p if p.exists() else options.path
        self._run: Run | None = None

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = load_run(self.path)
        return self._run

    def info(self) -> EngineInfo:
        """The recorded engine's own identity: the run it replays describes the real engine."""
        src = self.run.manifest.engine
        return EngineInfo(
            kind=src.kind,
            model=src.model,
            options=src.options | {"replayed_from": str(self.path)},
            env=src.env,
            versions=src.versions,
            tokenizer=src.tokenizer,
        )

    def tokenize(self, text: str) -> list[int]:
        raise ConfigError(
            "recorded: a stored run cannot tokenize new text; its prompts come from the baseline's records"
        )

    def prompt_token_ids(self, prompt) -> tuple[int, ...]:
        rec = self.run.records.get(prompt.id)
        if rec is None:
            raise ConfigError(f"recorded: baseline {self.path} has no prompt {prompt.id!r}")
        return rec.prompt_token_ids

    def check_compatible(self, prompt_sha256: str, sampling: Sampling) -> None:
        """Refuse a baseline captured under other conditions, naming the field that differs."""
        m = self.run.manifest
        checks = [
            ("prompt set sha256", m.prompt_set.get("sha256"), prompt_sha256),
            ("max_tokens", m.sampling.max_tokens, sampling.max_tokens),
        ]
        if self.options.model is not None:
            checks.append(("model", m.engine.model, self.options.model))
        for field, have, want in checks:
            if have != want:
                raise ConfigError(
                    f"baseline {self.path} does not fit this gate: {field} is {have!r} in the baseline, "
                    f"{want!r} in the gate; re-capture it with `strict-gate capture`"
                )
        if m.sampling.top_logprobs < sampling.top_logprobs:
            raise ConfigError(
                f"baseline {self.path} does not fit this gate: top_logprobs is {m.sampling.top_logprobs} "
                f"in the baseline, the gate asks for {sampling.top_logprobs}"
            )

    def generate(self, prompts: Sequence[PromptInput], sampling: Sampling) -> Iterator[Record]:
        for p in prompts:
            rec = self.run.records.get(p.id)
            if rec is not None:
                yield rec
