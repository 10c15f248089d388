"""The end-of-sequence ids vLLM stops on, read from a model directory, for the engine protocol.

vLLM stops greedy decoding on the tokenizer's eos token and on every id of the model's
generation_config.json `eos_token_id` (an int or a list). A command engine is sent that set
(`eos_token_ids` in a generate request) so that a binary need not re-derive it and get it
subtly different: one missing id makes every prompt that ends there a length mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

from strict_gate.core.model_files import find_tokenizer_json
from strict_gate.errors import ConfigError
from strict_gate.runs.records import Run


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read it for the eos ids: {e}; set eos_token_ids in the arm", path=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object; set eos_token_ids in the arm", path=str(path))
    return data


def _ids(value: object, path: Path) -> list[int]:
    ids = [value] if isinstance(value, int) else value
    if value is None:
        return []
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return list(ids)
    raise ConfigError(f"eos_token_id {value!r} is not a token id or a list of them; set eos_token_ids in the arm",
                      path=str(path))


def _tokenizer_eos(tokenizer_json: Path) -> list[int]:
    """tokenizer_config.json's eos_token (a string or {"content": ...}) as an id of tokenizer.json."""
    config = tokenizer_json.parent / "tokenizer_config.json"
    if not config.is_file():
        return []
    eos = _read(config).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return []
    tok = _read(tokenizer_json)
    for added in tok.get("added_tokens") or ():
        if isinstance(added, dict) and added.get("content") == eos and isinstance(added.get("id"), int):
            return [added["id"]]
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(eos), int):
        return [vocab[eos]]
    return []


def eos_token_ids(tokenizer_json: Path) -> tuple[int, ...] | None:
    """The stop ids for the model directory holding `tokenizer_json`: generation_config.json's
    eos_token_id (else config.json's) plus the tokenizer's eos token; None when none is named."""
    d = tokenizer_json.parent
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = d / name
        if path.is_file():
            ids = _ids(_read(path).get("eos_token_id"), path)
            if ids:
                break
    ids += [i for i in _tokenizer_eos(tokenizer_json) if i not in ids]
    return tuple(ids) or None


def run_stop_ids(*runs: Run) -> frozenset[int] | None:
    """The ids known to end a sequence in runs compared with each other: an arm's eos_token_ids
    option, else those of the model directory holding its tokenizer, the first run's first; None
    when none names any (a stop after a flip is then unjudged: judge/cascade.py's stop_problem).
    The gate and the invariance verdict both read them here, so both judge a stop alike."""
    for run in runs:
        engine = run.manifest.engine
        ids = engine.options.get("eos_token_ids")
        if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
            return frozenset(ids)
        path = find_tokenizer_json(engine.tokenizer, Path(run.path)) if engine.tokenizer else None
        try:
            found = eos_token_ids(path) if path is not None else None
        except ConfigError:
            found = None
        if found:
            return frozenset(found)
    return None
