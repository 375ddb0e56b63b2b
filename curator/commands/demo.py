"""`curator demo`: the whole pipeline offline on a tiny target, in minutes."""

from __future__ import annotations

from pathlib import Path

import typer

from curator.demo.pipeline import DemoSettings, run_demo


def demo(
    workdir: Path = typer.Option(Path("curator-demo"), "--workdir", help="Where every stage's output stays."),
    quick: bool = typer.Option(False, "--quick", help="Smaller settings (for tests): fewer rows and steps."),
) -> None:
    """Run scout -> review -> build-mix -> generate -> plan -> hidden-states -> train -> export -> doctor -> eval."""
    settings = DemoSettings()
    if quick:
        settings = DemoSettings(rows_per_source=16, target_train_s=10.0, target_steps=80, gen_max_tokens=32,
                                train_steps=20, train_batch=4, train_max_length=192, eval_prompts=6,
                                eval_max_new_tokens=24)
    run_demo(workdir, settings)


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
