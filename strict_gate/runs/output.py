"""Where results go: checked before any engine starts, and never half-replaced.

A run that fails or is interrupted must not destroy the complete run it was told to replace,
a gate name must not steer a report outside output_dir, and a directory that cannot be
written is bad input (exit 2) found before minutes of model loading, not a traceback after.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from strict_gate.core.files import new_temp_dir
from strict_gate.core.redact import scrub_tree
from strict_gate.errors import ConfigError, InputError, StrictGateError
from strict_gate.runs.layout import RunDir
from strict_gate.runs.records import RunStatus, write_text_atomic

MAX_NAME_CHARS = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(name: str) -> str:
    """A gate name as one file name: [A-Za-z0-9._-] only, no leading dot, bounded length."""
    return _UNSAFE.sub("_", name).lstrip(".")[:MAX_NAME_CHARS] or "gate"


def inside(path: Path, root: Path) -> Path:
    """`path`, after checking that it resolves to a place under `root`."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise ConfigError(f"refusing to write outside the output directory {root}", path=str(path))
    return path


def ensure_writable_dir(path: Path, what: str = "output directory") -> None:
    """Create `path` if needed and prove it can hold files; exit 2 with the reason otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(dir=path, prefix=".strict-gate-probe-"))
    except FileExistsError:
        raise InputError(f"the {what} is a file, not a directory", path=str(path)) from None
    except OSError as e:
        raise InputError(f"the {what} cannot be written: {e.strerror or e}", path=str(path)) from None


def _run_status(target: Path) -> str | None:
    """What sits at an output target: None (nothing worth keeping) or a run's status."""
    if not target.exists() and not target.is_symlink():
        return None
    if not target.is_dir():
        raise InputError("the output exists and is not a directory", path=str(target))
    if not any(target.iterdir()):
        return None
    try:
        status = json.loads(RunDir(target).manifest.read_text(encoding="utf-8")).get("status")
    except FileNotFoundError:
        raise InputError(
            "the output directory is not empty and is not a run directory; refusing to replace it",
            path=str(target),
        ) from None
    except (OSError, ValueError, AttributeError):
        return "unreadable"
    return status if isinstance(status, str) else "unreadable"


def _retarget(staged: Path, dest: Path) -> None:
    """The manifest names files by path (an engine's log): name them where they will be."""
    manifest = RunDir(staged).manifest
    if manifest.is_file():
        text = manifest.read_text(encoding="utf-8")
        if str(staged) in text:
            write_text_atomic(manifest, text.replace(str(staged), str(dest)))


def _swap_in(new: Path, target: Path) -> None:
    """Put `new` at `target`; whatever was at `target` is removed only once `new` is in place."""
    _retarget(new, target)
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.replace(target, old)  # onto an empty directory: allowed
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_run_dir(target: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a new sibling directory to write a run into; on success it replaces `target`.

    A complete run at `target` is refused unless `force`. On failure or interrupt `target`
    is left as it was when it held a complete run (the attempt is kept beside it as
    `<target>.failed-<time>`), and otherwise receives the failed run, as a record of what went
    wrong."""
    target = Path(target)
    status = _run_status(target)
    if status == RunStatus.COMPLETE and not force:
        raise InputError("holds a complete run; pass --force to replace it", path=str(target))
    ensure_writable_dir(target.parent, "output's parent directory")
    tmp = new_temp_dir(target.parent, f".{target.name}.tmp-")  # becomes the run: the umask's mode
    try:
        yield tmp
    except BaseException as e:
        scrub_tree(tmp)
        if not any(tmp.iterdir()):
            tmp.rmdir()
        elif status == RunStatus.COMPLETE:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            kept = new_temp_dir(target.parent, f"{target.name}.failed-{stamp}-")
            _retarget(tmp, kept)
            os.replace(tmp, kept)  # onto the new empty directory
            if isinstance(e, StrictGateError) and e.args:
                e.args = (f"{e.args[0]}\n{target} still holds the previous complete run; this attempt is in {kept}",)
        else:
            _swap_in(tmp, target)
        raise
    scrub_tree(tmp)
    _swap_in(tmp, target)
