"""The `curator` command line: one typer app; each stage registers its commands from
`curator/commands/`. Errors the toolkit raises become one red line and exit status 1."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click
import typer
from rich.markup import escape

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

# Each command name, and the module under curator/commands/ whose `register(app)` adds it. A run
# imports only its command's module: `curator sql` must not pay seconds for torch and
# transformers, which the model-side stages import. `--help` (or an unknown name) imports all.
COMMANDS = {
    "sql": "catalog", "catalog": "catalog", "scout": "scout", "hub": "scout", "build-mix": "mix",
    "generate": "generate", "plan": "hidden_states", "hidden-states": "hidden_states", "train": "train",
    "export": "train", "eval": "evaluate", "doctor": "evaluate", "demo": "demo",
    "bench-serve": "bench_serve",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """Return the CLI app with the commands `argv` needs registered (every command when unsure)."""
    app = typer.Typer(
        name="curator",
        help="Find, curate and regenerate training data for EAGLE-3 draft models; train, export and check them.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root() -> None:
        """Find, curate and regenerate training data for EAGLE-3 draft models; train, export and check them."""
        # A callback keeps the app a group of commands even when one module registers one command.

    name = next((a for a in (argv or []) if not a.startswith("-")), None)
    for module in [COMMANDS[name]] if name in COMMANDS else COMMAND_MODULES:
        importlib.import_module(f"curator.commands.{module}").register(app)
    return app


def __getattr__(name: str) -> typer.Typer:
    # `from curator.cli import app`: the whole app, built on first use (tests drive it with CliRunner)
    if name == "app":
        return build_app()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and exit with) its status."""
    try:
        args = sys.argv[1:] if argv is None else argv
        result = build_app(args)(args=args, prog_name="curator", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except (CuratorError, TrainingError) as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
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
            f"[bold red]error:[/] unexpected {type(exc).__name__}: {escape(first)} "
            f"(set {DEBUG_ENV}=1 for the traceback, and please report it)",
            highlight=False, markup=True,
        )
        code = 1
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
