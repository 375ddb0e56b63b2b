"""`curator demo`: the whole pipeline offline on a tiny target, in minutes."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    workdir: Path = typer.Option(Path("curator-demo"), "--workdir", help="Where every stage's output stays."),
    quick: bool = typer.Option(False, "--quick", help="Smaller settings (for tests): fewer rows and steps."),
    fresh: bool = typer.Option(False, "--fresh", help="Remove what an earlier demo made in --workdir and start over "
                                                      "(default: skip the stages it finished)."),
) -> None:
    """Run scout -> review -> profile -> build-mix -> target -> generate -> plan -> hidden-states -> train -> export -> doctor -> eval.

    Offline, on the machine it runs on: the scouts plan with rules over a bundled Hub snapshot,
    profile reads a request log it writes (coding and agentic requests), and target trains the small
    model the demo serves.
    """
    from curator.demo.pipeline import QUICK, DemoSettings, run_demo

    run_demo(workdir, QUICK if quick else DemoSettings(), fresh=fresh)


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
