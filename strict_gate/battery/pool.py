"""A battery's pool: prompt sets as they are, or plain-text files cut into passages.

Every pool file is hashed as read, so the provenance names exactly what was chosen from.
Each prompt carries a group (its first tag, else its file's name): the coverage constraint
spreads a battery over groups so it cannot collapse onto one kind of text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from strict_gate.core.files import file_sha256
from strict_gate.errors import InputError
from strict_gate.runs.prompts import (
    MAX_PROMPT_BYTES,
    Prompt,
    PromptSet,
    check_regular_file,
    load_prompts,
    prompt_set_sha256,
)

_WORD = re.compile(r"\S+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Split:
    """How a plain-text file is cut: consecutive passages of min_words..max_words words (each
    length drawn from a seeded generator, whitespace inside kept as it was), a passage shorter
    than min_words at the end dropped, and a passage whose whitespace-collapsed, lower-cased
    text was seen before (in any pool file) dropped as a duplicate."""

    min_words: int = 16
    max_words: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise InputError(f"--split-words {self.min_words}:{self.max_words}: need 1 <= MIN <= MAX")

    def to_json(self) -> dict:
        return {"min_words": self.min_words, "max_words": self.max_words, "seed": self.seed, "dedup": "casefold+whitespace"}


def parse_split_words(text: str) -> tuple[int, int]:
    """"16:64" -> (16, 64); anything else is bad input."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if m is None:
        raise InputError(f"--split-words {text!r}: expected MIN:MAX, two whole numbers of words")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class PoolSource:
    path: str
    sha256: str
    kind: str  # "prompt-set" | "text"
    prompts: int

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "kind": self.kind, "prompts": self.prompts}


@dataclass(frozen=True)
class Pool:
    prompts: PromptSet
    groups: dict[str, str]  # prompt id -> group
    sources: tuple[PoolSource, ...]
    split: Split | None


def group_of(prompt: Prompt, source: str) -> str:
    return prompt.tags[0] if prompt.tags else source


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def cut_passages(text: str, source: str, split: Split, seen: set[str]) -> list[Prompt]:
    """The passages of one text file, ids <source>-NNNNN, tags [source]."""
    rng = random.Random(f"{split.seed}:{source}")
    words = list(_WORD.finditer(text))
    out: list[Prompt] = []
    i = 0
    while i + split.min_words <= len(words):
        n = rng.randint(split.min_words, split.max_words)
        chunk = words[i : i + n]
        i += n
        passage = text[chunk[0].start() : chunk[-1].end()]
        key = _norm(passage)
        if len(chunk) < split.min_words or key in seen:
            continue
        seen.add(key)
        out.append(Prompt(id=f"{source}-{len(out) + 1:05d}", text=passage, tags=(source,)))
    return out


def _read_text(path: Path) -> str:
    try:
        check_regular_file(path, "a plain-text pool file", MAX_PROMPT_BYTES)
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("pool file not found", path=str(path)) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start}); a pool file must be UTF-8", path=str(path)) from None
    except OSError as e:
        raise InputError(f"cannot read pool file: {e.strerror or e}", path=str(path)) from None


def load_pool(paths: list[Path], split: Split | None = None) -> Pool:
    """Read every pool file: `.jsonl` as a prompt set, anything else cut into passages when
    `split` is given (else refused). Ids must be unique over the whole pool."""
    if not paths:
        raise InputError("no pool given: name at least one prompt set or text file")
    prompts: list[Prompt] = []
    groups: dict[str, str] = {}
    where: dict[str, str] = {}
    sources: list[PoolSource] = []
    seen: set[str] = set()
    for path in paths:
        source = _UNSAFE.sub("_", path.stem).lstrip(".") or "text"
        if path.suffix == ".jsonl":
            got, kind = list(load_prompts(path).prompts), "prompt-set"
        elif split is None:
            raise InputError("not a prompt set (.jsonl); pass --split to cut a plain-text file into passages",
                             path=str(path))
        else:
            got, kind = cut_passages(_read_text(path), source, split, seen), "text"
        for p in got:
            if p.id in where:
                raise InputError(f"prompt id {p.id!r} is also in {where[p.id]}: ids must be unique over the pool",
                                 path=str(path))
            where[p.id] = str(path)
            groups[p.id] = group_of(p, source)
        prompts.extend(got)
        sources.append(PoolSource(str(path), file_sha256(path), kind, len(got)))
    if not prompts:
        raise InputError("the pool holds no prompts (every text file was shorter than one passage)",
                         path=str(paths[0]))
    tup = tuple(prompts)
    ps = PromptSet(name="pool", path=",".join(str(p) for p in paths), prompts=tup, sha256=prompt_set_sha256(tup))
    return Pool(ps, groups, tuple(sources), split)
