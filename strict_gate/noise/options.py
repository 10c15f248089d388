"""What `strict-gate noise` was asked to measure, kept in its report directory for `--resume`.

A resumed measurement must measure what the interrupted one set out to, so its command line
(what gate.toml does not hold) is written beside gate.toml when it starts: its paths made
absolute (a resume may run from another directory), and sealed with the gate state's key, so an
edited file is refused rather than measuring something else into runs made for the first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from strict_gate.errors import InputError
from strict_gate.runs.records import write_json_atomic

OPTIONS_FILE = "noise-options.json"


@dataclass(frozen=True)
class NoiseOptions:
    """`strict-gate noise`'s options: the variations asked for and where the profile goes."""

    batch: tuple[int, ...] = (8,)
    chunks: tuple[int, ...] = ()
    prefill: bool = True
    against: tuple[str, ...] = ()  # a run directory, or CONFIG[:arm]
    baseline: str | None = None
    runs: int | None = None
    out: str | None = None

    def anchored(self) -> NoiseOptions:
        """The same options with every path absolute, as the working directory resolves it now."""
        return NoiseOptions(self.batch, self.chunks, self.prefill, tuple(_absolute(a) for a in self.against),
                            None if self.baseline is None else _absolute(self.baseline), self.runs,
                            None if self.out is None else _absolute(self.out))


def _absolute(path: str) -> str:
    """`path` (or CONFIG:arm's CONFIG) from the working directory; an absolute one as it is."""
    return path if Path(path).is_absolute() else str(Path.cwd().resolve() / path)


def _digest(body: dict, key: str) -> str:
    text = json.dumps(body, sort_keys=True) + key
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_options(report: Path, opts: NoiseOptions, key: str) -> None:
    """The options into `report`, sealed with `key` (the gate state's seal key)."""
    body = asdict(opts)
    write_json_atomic(report / OPTIONS_FILE, {"options": body, "digest": _digest(body, key)})


def read_options(report: Path, key: str) -> NoiseOptions:
    """The options an interrupted measurement was started with; an edited file is refused."""
    path = report / OPTIONS_FILE
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        body, digest = dict(d["options"]), str(d["digest"])
        opts = NoiseOptions(tuple(int(b) for b in body["batch"]), tuple(int(c) for c in body["chunks"]),
                            bool(body["prefill"]), tuple(str(a) for a in body["against"]),
                            None if body["baseline"] is None else str(body["baseline"]),
                            None if body["runs"] is None else int(body["runs"]),
                            None if body["out"] is None else str(body["out"]))
    except FileNotFoundError:
        raise InputError(f"{OPTIONS_FILE} is missing: not a `strict-gate noise` report directory, or made by a "
                         "strict-gate without resume; start the measurement again", path=str(report)) from None
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"not noise options ({type(e).__name__}: {e})", path=str(path)) from None
    if digest != _digest(asdict(opts), key):
        raise InputError("its digest does not match its options: they were edited; start a new measurement",
                         path=str(path))
    return opts
