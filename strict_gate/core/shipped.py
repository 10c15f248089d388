"""The files a repository checkout ships beside the package (gates/, baselines/, prompts/),
found through the package itself, so a path to one works from any working directory. An
editable or in-tree install has them (scripts/install.sh installs editable); a wheel has the
package alone, and then a path is refused by name."""

from __future__ import annotations

from pathlib import Path

from strict_gate.errors import InputError

ROOT = Path(__file__).resolve().parents[2]  # strict_gate/core/shipped.py -> the checkout


def shipped(relative: str | Path) -> Path:
    """The checkout's file `relative` (e.g. "gates/demo.toml"), absolute; InputError when this
    install does not have it, or when `relative` points outside the checkout."""
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts:
        raise InputError(f"shipped({str(relative)!r}): a path inside the repository checkout, "
                         "e.g. 'gates/demo.toml'")
    path = ROOT / rel
    if not path.exists():
        raise InputError(f"{rel} is not in this install: gates/, baselines/ and prompts/ ship with the "
                         "repository checkout (an editable install, as scripts/install.sh makes), not with "
                         "the wheel", path=str(path))
    return path
