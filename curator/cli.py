"""The `curator` command line: one typer app; each stage registers its commands from
`curator/commands/`. Errors the toolkit raises become one red line and exit status 1."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click
import typer

from curator.errors import CuratorError
from curator.ui import console
from training.errors import TrainingError

try:  # typer >= 0.29 ships its own copy of click, whose exceptions are not click's
    from typer._click.exceptions import ClickException as _TyperClickException
except ImportError:
    _TyperClickException = click.ClickException
_EXITS = (click.exceptions.Exit, typer.Exit)
_ABORTS = (click.exceptions.Abort, typer.Abort, KeyboardInterrupt)

DEBUG_ENV = "CURATOR_DEBUG"

app = typer.Typer(
    name="curator",
    help="Find, curate and regenerate training data for EAGLE-3 draft models; train, export and check them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One module per stage under curator/commands/, each with `register(app)`. A stage whose module
# is not there yet is simply not offered, so `--help` lists only commands that exist.
COMMAND_MODULES = ("catalog", "scout", "mix", "generate", "hidden_states", "train", "evaluate", "demo")

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"curator.commands.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"curator.commands.{_name}":
            raise
        continue
    _module.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and exit with) its status."""
    try:
        result = app(args=argv, standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except (CuratorError, TrainingError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True)
        code = 1
    except _EXITS as exc:
        code = exc.exit_code
    except (click.ClickException, _TyperClickException) as exc:
        exc.show()
        code = exc.exit_code
    except _ABORTS:
        console.print("[yellow]interrupted[/]")
        code = 130
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        console.print(
            f"[bold red]error:[/] unexpected {type(exc).__name__}: {first} "
            f"(set {DEBUG_ENV}=1 for the traceback, and please report it)",
            highlight=False, markup=True,
        )
        code = 1
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
