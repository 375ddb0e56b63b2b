"""`curator train` and `curator export`: train the EAGLE-3 draft on a hidden-state store, export it for serving."""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from curator.errors import ConfigError
from curator.loss_report import LOSS_NOTE, loss_text
from curator.train_progress import accept_length_rows, training_progress
from curator.ui import console, rows_table, summary_table
from training.errors import TrainingError
from training.train.config import load_run_config


def train(
    overrides: Optional[list[str]] = typer.Argument(
        None, metavar="KEY=VALUE",
        help="Options over the config file's, e.g. data=states/ target=/models/T out=runs/d1 max_steps=600. "
             "Every option is a field of training.train.config.TrainConfig (see docs/training.md)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML or JSON file describing the run."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in `out` from its latest checkpoint."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", help="Stop after N optimizer steps of this run, with a checkpoint; continue it later with --resume (for time-limited jobs)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog file to record the run in."),
) -> None:
    """Train an EAGLE-3 draft with training-time test: `curator train --config FILE \\[key=value ...]`.

    The same arguments work under torchrun, and as `python -m training.trainer` without curator.

    The run directory keeps the resolved options as train_config.json.
    """
    try:
        cfg = load_run_config(config, overrides or [])
    except TrainingError as exc:
        raise ConfigError(str(exc) if config and str(config) in str(exc) else f"{config or 'options'}: {exc}") from exc  # a file's own error names it already
    from curator.stages import train_and_record  # the trainer loads torch: only a run pays for it

    is_main = int(os.environ.get("RANK", "0")) == 0
    bar, show = training_progress()
    factory = None
    if cfg.engine:  # engine-fed: the trainer draws states through curator's vLLM client
        from curator.hidden.engine_feed import capture_factory

        factory = capture_factory(cfg)
    with bar if is_main else nullcontext():
        recorded = train_and_record(cfg, catalog, record=is_main, resume=resume, on_metrics=show,
                                    stop_after_steps=stop_after, capture_factory=factory)
    result = recorded.result
    if not is_main:
        return
    final = result.eval or result.train
    rows: list[tuple[str, Any]] = [("run", str(result.run_dir)), ("step", result.step),
                                   ("checkpoint", str(result.checkpoint)),
                                   ("draft vocab coverage", f"{100 * result.vocab.get('coverage', 0):.2f}%")]
    if result.train:
        rows += [("train loss", loss_text(result.train)), *accept_length_rows(result.train, "train").items()]
    feed = result.train.get("feed") if result.train else None
    if feed:
        rows += [("engine captures (this session)", f"{feed['captured']:,} samples, {feed['captured_tokens']:,} tokens"),
                 ("engine cache", f"{feed['cache_hits']:,} reads, {feed['cache_bytes']:,} bytes kept"),
                 ("waited for the engines", f"{feed['wait_s']:.1f} s")]
    if result.eval:
        rows += [("eval loss", loss_text(result.eval)), *accept_length_rows(result.eval, "eval").items()]
    console.print(summary_table("curator train", rows))
    if not (result.eval or result.train or {}).get("target_entropy"):
        console.print(f"[dim]{LOSS_NOTE}[/]", highlight=False)
    if final:
        # TTT step k drafts the token at position k + 1: named by position, as `curator eval` names them
        console.print(rows_table(["draft position", "acc", "cond acc"],
                                 [(k + 1, a, c) for k, (a, c) in enumerate(zip(final["acc"], final["cond_acc"]))],
                                 title=f"accuracy per draft position, K={len(final['acc'])} "
                                       f"({'eval' if result.eval else 'train'})"))
    if recorded.warning:  # the draft is complete on disk whatever the catalog says: a warning, not an error
        console.print(f"[yellow]warning:[/] {escape(recorded.warning)}")


def export(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A run directory (its latest checkpoint) or a checkpoint."),
    format: str = typer.Option("sglang", "--format", help="sglang or speculators."),
    out: Path = typer.Option(..., "--out", help="Directory to write config.json and model.safetensors to."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="The target's Hub id for the speculators layout "
                                           "(vLLM resolves it), e.g. meta-llama/Llama-3.1-8B-Instruct."),
    target: Optional[Path] = typer.Option(None, "--target", help="The target's model folder, when it moved since "
                                          "training (the speculators layout carries its embeddings)."),
) -> None:
    """Export a trained draft in SGLang's or vLLM speculators' layout, layer ids in each engine's numbering."""
    from training.drafts.registry import exported_verifier
    from training.export.export import export_checkpoint, formats, is_hub_id

    if format not in formats():
        raise ConfigError(f"--format must be one of {', '.join(formats())}, not {format!r}")
    path = export_checkpoint(checkpoint, out, fmt=format, verifier=verifier, target_dir=target)
    name = exported_verifier(path)
    if name is not None and not is_hub_id(name):
        console.print(f"[yellow]warning:[/] the verifier is the local folder {escape(name)}; `vllm serve` needs the "
                      "target's Hub id: export again with --verifier ORG/NAME", highlight=False)
    console.print(summary_table("curator export", [("format", format), ("out", str(path)),
                                                    ("files", ", ".join(sorted(p.name for p in path.iterdir())))]))


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("export")(export)
