"""`curator train` and `curator export`: train the EAGLE-3 draft on a hidden-state store, export it for serving."""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.progress import TextColumn

from curator.errors import CatalogError, ConfigError
from curator.ui import console, progress, rows_table, summary_table
from training.errors import TrainingError
from training.export import FORMATS, export_checkpoint
from training.train_config import TrainConfig
from training.trainer import TrainResult, train as run_training


def load_train_config(path: Path | None, overrides: dict[str, Any]) -> TrainConfig:
    """Return the run's config: the file's options (YAML or JSON), then the non-None flags over them."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read training config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of option: value")
    try:
        cfg = TrainConfig.from_dict(data).replace(**overrides)
    except TrainingError as exc:
        raise ConfigError(f"{path or 'flags'}: {exc}") from exc
    missing = [name for name in ("data", "target", "out") if not getattr(cfg, name)]
    if missing:
        raise ConfigError(f"set {', '.join('--' + m for m in missing)} (or their keys in --config)")
    return cfg


def _fmt_acc(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def _record_run(catalog: Path | None, result: TrainResult, cfg: TrainConfig) -> None:
    try:
        from curator.catalog import Catalog
    except ModuleNotFoundError:
        return
    try:
        with Catalog.open(catalog) as cat:
            cat.record_training_run(result.run_dir.name, result.run_dir, cfg.to_dict(),
                                    {"train": result.train, "eval": result.eval, "vocab": result.vocab,
                                     "checkpoint": str(result.checkpoint), "step": result.step})
    except CatalogError as exc:
        console.print(f"[yellow]warning:[/] the run was not recorded in the catalog: {exc}")


def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON file with every option of the run."),
    data: Optional[str] = typer.Option(None, "--data", help="Hidden-state store directory (with --online: a generation output)."),
    online: Optional[bool] = typer.Option(None, "--online/--offline", help="Run the target beside the draft instead of reading stored states."),
    target: Optional[str] = typer.Option(None, "--target", help="The target's local model directory."),
    out: Optional[str] = typer.Option(None, "--out", help="Run directory (checkpoints, metrics.jsonl, vocab.json)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its latest checkpoint."),
    ttt_steps: Optional[int] = typer.Option(None, "--ttt-steps", help="Training-time-test steps (default 7)."),
    draft_vocab_size: Optional[int] = typer.Option(None, "--draft-vocab-size", help="Draft vocabulary (default 32000)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (default 1e-4)."),
    epochs: Optional[float] = typer.Option(None, "--epochs"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimizer steps (overrides --epochs)."),
    global_batch_size: Optional[int] = typer.Option(None, "--global-batch-size", help="Sequences per step, all ranks."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Sequences per forward per rank."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Tokens kept per sample (default 2048)."),
    log_every: Optional[int] = typer.Option(None, "--log-every"),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="0: at the end only."),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="0: at the end only."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu, cuda."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", help="End this session after N steps (checkpointed)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog file to record the run in."),
) -> None:
    """Train an EAGLE-3 draft with training-time test on stored target hidden states."""
    overrides = dict(data=data, online=online, target=target, out=out, ttt_steps=ttt_steps, draft_vocab_size=draft_vocab_size,
                     lr=lr, epochs=epochs, max_steps=max_steps, global_batch_size=global_batch_size,
                     micro_batch_size=micro_batch_size, max_length=max_length, log_every=log_every,
                     eval_every=eval_every, save_every=save_every, seed=seed, device=device)
    cfg = load_train_config(config, overrides)
    is_main = int(os.environ.get("RANK", "0")) == 0
    bar = progress(TextColumn("{task.fields[status]}"))
    task = bar.add_task("train", total=None, status="")

    def show(record: dict[str, Any]) -> None:
        if record["split"] == "train":
            bar.update(task, completed=record["step"], total=record["total_steps"],
                       status=f"loss {record['loss']:.3f}  acc {_fmt_acc(record['acc'][:3])}  "
                              f"τ {record['accept_length']:.2f}  {record['tokens_per_s']:,.0f} tok/s")
        else:
            bar.console.print(f"[bold]eval[/] step {record['step']}: loss {record['loss']:.3f}  "
                              f"acc {_fmt_acc(record['acc'])}  accept length {record['accept_length']:.3f}")

    with bar if is_main else nullcontext():
        result = run_training(cfg, resume=resume, on_metrics=show, stop_after_steps=stop_after)
    if not is_main:
        return
    final = result.eval or result.train
    rows: list[tuple[str, Any]] = [("run", str(result.run_dir)), ("step", result.step),
                                   ("checkpoint", str(result.checkpoint)),
                                   ("draft vocab coverage", f"{100 * result.vocab.get('coverage', 0):.2f}%")]
    if result.train:
        rows += [("train loss", result.train["loss"]), ("train accept length", result.train["accept_length"])]
    if result.eval:
        rows += [("eval loss", result.eval["loss"]), ("eval accept length", result.eval["accept_length"])]
    console.print(summary_table("curator train", rows))
    if final:
        console.print(rows_table(["TTT step", "acc", "cond acc"],
                                 [(k, a, c) for k, (a, c) in enumerate(zip(final["acc"], final["cond_acc"]))],
                                 title="per-step accuracy (eval)" if result.eval else "per-step accuracy (train)"))
    _record_run(catalog, result, cfg)


def export(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A run directory (its latest checkpoint) or a checkpoint."),
    format: str = typer.Option("sglang", "--format", help="sglang or speculators."),
    out: Path = typer.Option(..., "--out", help="Directory to write config.json and model.safetensors to."),
) -> None:
    """Export a trained draft in SGLang's or vLLM speculators' layout."""
    if format not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
    path = export_checkpoint(checkpoint, out, fmt=format)
    console.print(summary_table("curator export", [("format", format), ("out", str(path)),
                                                    ("files", ", ".join(sorted(p.name for p in path.iterdir())))]))


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("export")(export)
