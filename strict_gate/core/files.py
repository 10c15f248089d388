"""Temporary files and directories that become results, created with the user's umask.

tempfile.mkstemp and mkdtemp create 0600 files and 0700 directories, which is right for
scratch space but wrong for a report or a run that is renamed into place: those must get
the mode any other file the user writes gets (0644 under umask 022, 0600 under 077).
Creating with mode 0666 / 0777 lets the kernel apply the umask itself, with no race on
reading it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

_ATTEMPTS = 100


def _name(directory: Path, prefix: str, suffix: str) -> Path:
    return directory / f"{prefix}{secrets.token_hex(6)}{suffix}"


def new_temp_file(directory: Path, prefix: str, suffix: str = ".tmp") -> tuple[int, Path]:
    """A new, empty file in `directory` open for writing (fd, path), mode 0666 & ~umask."""
    for _ in range(_ATTEMPTS):
        path = _name(directory, prefix, suffix)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory}")


def new_temp_dir(directory: Path, prefix: str) -> Path:
    """A new, empty directory in `directory`, mode 0777 & ~umask."""
    for _ in range(_ATTEMPTS):
        path = _name(directory, prefix, "")
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory}")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks by hashlib (model files are hundreds of MB)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
