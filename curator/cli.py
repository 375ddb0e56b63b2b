"""The `curator` command line: one typer app; each stage registers its commands from
`curator/commands/`. Errors the toolkit raises become one red line and exit status 1."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import click
import typer
import typer.main
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from curator.errors import CuratorError
from curator.ui import console
from training.errors import TrainingError

if TYPE_CHECKING:
    # The types typer's classes take: typer >= 0.29 ships its own copy of click (typer._click),
    # whose Context, Command and HelpFormatter are not the `click` module's. Annotations only, never
    # evaluated at run time (`from __future__ import annotations`): nothing here imports typer._click.
    from typer._click import Command, Context, HelpFormatter, Parameter

try:  # typer >= 0.29 ships its own copy of click, whose exceptions are not click's
    from typer._click.exceptions import ClickException as _TyperClickException

    _CLICK_ERRORS: tuple[type[click.ClickException] | type[_TyperClickException], ...] = (click.ClickException, _TyperClickException)
except ImportError:
    _CLICK_ERRORS = (click.ClickException,)
_EXITS = (click.exceptions.Exit, typer.Exit)
_ABORTS = (click.exceptions.Abort, typer.Abort, KeyboardInterrupt)

DEBUG_ENV = "CURATOR_DEBUG"

# Each command name, and the module under curator/commands/ whose `register(app)` adds it. A run
# imports only its command's module, when click resolves the name: `curator sql` must not pay
# seconds for torch and transformers, which the model-side stages import.
COMMANDS = {
    "tap": "tap", "profile": "profile", "scout": "scout", "hub": "scout", "sql": "catalog", "catalog": "catalog",
    "build-mix": "mix", "target": "target", "generate": "generate", "plan": "hidden_states",
    "hidden-states": "hidden_states", "train": "train", "export": "train", "export-data": "handoff", "eval": "evaluate", "doctor": "doctor",
    "forecast": "forecast", "bench-serve": "bench_serve", "demo": "demo",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))

# What `curator --help` lists for each command, so that listing them imports none of them (a test
# checks each line against the command's own docstring). A command missing here is imported to
# ask it.
COMMAND_HELP = {
    "tap": "Serve as a proxy in front of the engine and record a scrubbed sample of its requests and the target's own answers.",
    "profile": "Profile a traffic sample: categories, lengths, turns, tool use, languages, matching features.",
    "scout": "Run research agents on the Hub, record their finds in the catalog and propose a recipe.",
    "hub": "Hub access without the agents: offline snapshots.",
    "sql": "Run SQL against the catalog (or over parquet files) and print every result.",
    "catalog": "Review candidate datasets: list, show, approve, reject.",
    "build-mix": "Build a prompt mix: read, normalise, filter, dedup and sample each source to its quota.",
    "target": "Make a target model folder: a GGUF file (or the registry's SmolLM2) turned into a Hugging Face folder, cached.",
    "generate": "Regenerate every answer of a mix through the target model; resumes by sample id.",
    "plan": "Show the disk a hidden-state capture takes: tokens, bytes/token, totals per max_len, free disk.",
    "hidden-states": "Capture the target's aux-layer (and final) hidden states of regenerated data into a shard store.",
    "train": "Train an EAGLE-3 draft with training-time test: `curator train --config FILE \\[key=value ...]`.",
    "export": "Export a trained draft in SGLang's or vLLM speculators' layout, layer ids in each engine's numbering.",
    "export-data": "Write curated data in another trainer's layout (speculators, SpecForge, ModelOpt), published whole; --check one.",
    "eval": "Measure acceptance length with real speculative decoding (the target verifies, greedy or sampled).",
    "doctor": "Check a draft export, its fit with the target and data, and a server launch command.",
    "forecast": "Forecast the samples per category that reach --goal acceptance, with a band and their cost.",
    "bench-serve": "Measure the draft inside the serving engine: tokens/s, time per output token, acceptance, speedup.",
    "demo": "Run scout -> review -> profile -> build-mix -> target -> generate -> plan -> hidden-states -> train -> export -> doctor -> eval.",
}


class _TyperParameter(Protocol):
    """What `_plain_metavars` reads and replaces on typer's TyperArgument and TyperOption beyond
    click's Parameter: `display_type` is typer's help label; `display_type_rich`,
    `_get_number_range_help_str` and `_usage_display_name` are typer's internal help hooks (the
    last two private), declared as attributes because this module replaces them per parameter."""

    display_type: Callable[[Context], str]
    display_type_rich: Callable[[Context], str | None]
    _get_number_range_help_str: Callable[[], str | None]
    _usage_display_name: Callable[[], str]


def _label(label: str) -> Callable[[Context], str]:
    """A `display_type_rich` that answers `label` (typer calls it as `display_type_rich(ctx=ctx)`)."""
    return lambda ctx: label


def _usage(usage: str) -> Callable[[], str]:
    """A `_usage_display_name` that answers `usage`."""
    return lambda: usage


def _plain_metavars(command: Command) -> None:
    """Drop typer's type placeholders where they say nothing: `<bool>` on flags, `<list[str]>`
    on repeatable options (shown as their item type, `<str>...`), `<float range> [x>=0.001]` on
    bounded numbers (shown as `<float>`: a value out of range is refused with the bound); recurse
    into groups."""
    ctx = command.context_class(command)
    params: list[Parameter | None] = [*command.params, command.get_help_option(ctx)]
    for param in params:
        if param is None:  # a command without a help option
            continue
        typer_param = cast(_TyperParameter, param)  # typer built it: a TyperArgument or a TyperOption
        if getattr(param, "_get_number_range_help_str", None) and typer_param._get_number_range_help_str():
            label = typer_param.display_type(ctx).replace(" range", "")
            typer_param.display_type_rich = _label(label)
            typer_param._get_number_range_help_str = lambda: None
        if param.param_type_name == "argument":
            # the usage line names an argument as click does (`curator sql STATEMENT`), not typer's `{statement}`
            name = param.metavar or param.name.upper()
            param.metavar = name
            usage = (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 and "..." not in name else "")
            typer_param._usage_display_name = _usage(usage)
        if param.param_type_name == "argument" and param.nargs != 1:
            # typer reads an argument's type label from the parameter itself, not its metavar
            label = typer_param.display_type(ctx).replace("list[", "").replace("]", "") + "..."
            typer_param.display_type_rich = _label(label)
        if getattr(param, "param_type_name", "") != "option":
            continue
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
        elif param.metavar is None and "|" in (label := str(typer_param.display_type(ctx) or "")) and len(label) > 14:
            # `<anthropic|openai>` would take its width from every help line: the help names the choices
            param.metavar = "<choice>"
        elif getattr(param, "multiple", False) and param.metavar is None:
            # `Optional[list[Path]]` reads `<Path>`: every other path option is `<path>`
            param.metavar = typer_param.display_type(ctx).replace("list[", "").replace("]", "").lower() + "..."
    for sub in getattr(command, "commands", {}).values():
        _plain_metavars(sub)


class LazyCommands(TyperGroup):
    """The root group: lists every command from COMMANDS without importing it, and imports a
    command's module only when that command runs (or shows its own help)."""

    _listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(dict.fromkeys([*self.commands, *COMMANDS]))

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            if self._listing and cmd_name in COMMAND_HELP:
                return TyperCommand(name=cmd_name, help=COMMAND_HELP[cmd_name])
            self.load(COMMANDS[cmd_name])
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            known = self.list_commands(ctx)
            close = difflib.get_close_matches(name.replace("_", "-").lower(), known, n=1, cutoff=0.6)
            if close:  # click says only "No such command"
                ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)

    def load(self, module: str) -> None:
        """Import `curator.commands.<module>` and add the commands it registers."""
        holder = typer.Typer()
        holder.callback()(lambda: None)  # keeps the holder a group even for a single command
        importlib.import_module(f"curator.commands.{module}").register(holder)
        group = typer.main.get_command(holder)
        if not isinstance(group, TyperGroup):  # the callback above makes the holder a group
            raise TypeError(f"curator.commands.{module}: typer built a {type(group).__name__}, not a group")
        for name, command in group.commands.items():
            _plain_metavars(command)
            self.commands.setdefault(name, command)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        help_option = self.get_help_option(ctx)
        if help_option is not None:
            help_option.metavar = ""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def build_app() -> typer.Typer:
    """Return the CLI app; a command's module is imported when that command is resolved."""
    app = typer.Typer(
        name="curator",
        cls=LazyCommands,
        help="Find, curate and regenerate training data for EAGLE-3 draft models; train, export and check them.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root() -> None:
        """Find, curate and regenerate training data for EAGLE-3 draft models; train, export and check them."""
        # A callback keeps the app a group of commands even when one module registers one command.

    return app


def __getattr__(name: str) -> typer.Typer:
    # `from curator.cli import app`: the app, built on first use (tests drive it with CliRunner)
    if name == "app":
        return build_app()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and exit with) its status."""
    try:
        args = sys.argv[1:] if argv is None else argv
        result = build_app()(args=args, prog_name="curator", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except (CuratorError, TrainingError) as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        code = 1
    except _EXITS as exc:
        code = exc.exit_code
    except _CLICK_ERRORS as exc:
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
