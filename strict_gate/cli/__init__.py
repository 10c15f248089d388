"""The `strict-gate` command: thin typer functions over the library.

Exit codes: 0 pass, 1 fail, 2 bad input or config, 3 engine failure or incomplete run (or a
speed ratio not separable from its bar), 4 slower than the [speed] bar or not comparable, 5 tokens
that move with the [invariance] variants (4 and 5 only when the token verdict passed; 5 wins over 4),
6 a token failure where the [golden] (blame = true) sides with the candidate at every failing prompt.
Heavy engines are imported only by the commands that run them; --help and compare need no torch.
"""

from __future__ import annotations

import typer

import strict_gate.cli.battery as battery
import strict_gate.cli.gate as gate
import strict_gate.cli.model as model
import strict_gate.cli.nightly as nightly
import strict_gate.cli.runs as runs

app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,  # help texts name TOML tables ([reference], [speed]): plain text, not rich markup
    no_args_is_help=True,
    help="Prove an inference engine emits exactly the tokens vLLM emits (greedy, token for token).",
    context_settings={"help_option_names": ["-h", "--help"]},
)

# the commands in the order --help lists them
app.command()(gate.gate)
app.command()(gate.bench)
app.command()(gate.invariance)
app.command()(gate.noise)
app.command()(gate.golden)
app.command()(runs.run)
app.command("check-engine")(runs.check_engine)
app.command()(runs.capture)
app.command()(runs.compare)
app.command()(runs.merge)
app.command()(nightly.diff)
app.command()(nightly.nightly)
app.command()(nightly.bisect)
app.command()(gate.diagnose)
app.command()(gate.localize)
app.command()(runs.show)
app.command()(runs.prompts)
app.add_typer(battery.battery_app, name="battery")
app.add_typer(model.model_app, name="model")


def main() -> None:  # pragma: no cover - console entry (`python -m strict_gate.cli`: __main__.py)
    app()

