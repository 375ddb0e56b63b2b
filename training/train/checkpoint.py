"""Training checkpoints: the format, saving, finding, reading and loading them back.

A run directory holds `checkpoints/step-NNNNNNN/` folders (each published by one rename) and
`checkpoints/latest.json` naming the newest. A checkpoint folder holds:
- `draft.safetensors`: the draft's trainable weights (float32; no embedding, which is the target's);
- `trainer_state.pt`: optimizer, scheduler, RNG, data position, pending metric sums (resume only):
  tensors and plain values only, read back with `torch.load(weights_only=True)`, so a planted or
  tampered file cannot run code on `--resume`;
- `meta.json`: the format, `draft_kind` (the registered kind the weights are of; absent in checkpoints from
  before kinds were recorded, which are EAGLE-3's), `draft_config` (whose `aux_layer_ids` are the one record of the layers
  the draft was trained on, in training.target.layers.CONVENTION), the target (`target_dir`,
  `target_config`), the store it was trained on, the vocab summary, `ttt_steps`, `train_config`
  and the held-out split (`split`: which ids trained and which were held out).
Export, evaluation and the trainer read checkpoints only through this module.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import save_file

from training.io.atomic import write_text
from training.io.diskspace import named_disk_full
from training.drafts.registry import kind_of_meta
from training.errors import DivergedError, TrainingError
from training.target.layers import check_layer_ids
from training.io.weights import nonfinite_tensors, read_weights

FORMAT = "curator-eagle3-checkpoint/2"
# /1 also recorded the layer ids at the top level, next to the same ids in draft_config.
READABLE_FORMATS = ("curator-eagle3-checkpoint/1", FORMAT)
REQUIRED_META = ("draft_config", "target_dir", "step")
WEIGHTS = "draft.safetensors"
TRAINER_STATE = "trainer_state.pt"
TRAINER_STATE_KEYS = ("optimizer", "scheduler", "rng", "step", "pending_sums", "pending_tokens")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest complete checkpoint directory of a run, if any."""
    pointer = Path(run_dir) / "checkpoints" / "latest.json"
    if not pointer.exists():
        return None
    try:
        name = json.loads(pointer.read_text(encoding="utf-8"))["name"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainingError(f"{pointer} is unreadable ({exc}); point --checkpoint at a checkpoints/step-* folder") from exc
    path = Path(run_dir) / "checkpoints" / str(name)
    return path if (path / "meta.json").exists() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """Return the checkpoint directory for a run directory (its latest) or a checkpoint directory."""
    p = Path(path)
    if (p / "meta.json").exists() and (p / WEIGHTS).exists():
        return p
    ckpt = latest_checkpoint(p)
    if ckpt is None:
        raise TrainingError(f"{p} is neither a checkpoint nor a run directory with one; train first")
    return ckpt


def save_checkpoint(
    run_dir: Path, weights: dict[str, torch.Tensor], meta: dict[str, Any], trainer_state: dict[str, Any] | None,
    *, check_finite: bool = True,
) -> Path:
    """Write checkpoints/step-NNNNNNN/ (weights, meta, optimizer state) atomically; return it.

    `weights` are the draft's trainable ones (its kind's `trainable_weights`). Refuses (DivergedError)
    weights that hold NaN or inf: no checkpoint of a diverged run is kept. `check_finite=False` is for
    a caller that has just checked the same weights itself (the trainer).
    """
    bad = nonfinite_tensors(weights) if check_finite else []
    if bad:
        raise DivergedError(f"the draft's weights hold NaN/inf ({', '.join(bad[:3])}) at step {meta['step']}: "
                            "training diverged; not saving it (lower lr or grad_clip and train again)")
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{int(meta['step']):07d}"
    tmp = root / f".{name}.{uuid.uuid4().hex[:6]}.tmp"
    tmp.mkdir()
    try:
        with named_disk_full(root):  # a full disk says so, not "unexpected pos ..."
            _write_checkpoint(tmp, weights, meta, trainer_state)
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text(root / "latest.json", json.dumps({"name": name, "step": int(meta["step"])}))
    return final


def _write_checkpoint(tmp: Path, weights: dict[str, torch.Tensor], meta: dict[str, Any],
                      trainer_state: dict[str, Any] | None) -> None:
    """Write a checkpoint's three files into the (temporary) folder `tmp`."""
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    save_file(state, str(tmp / WEIGHTS), metadata={"format": FORMAT})
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / "meta.json").write_text(json.dumps({**meta, "format": FORMAT}, indent=2, default=str), encoding="utf-8")


def read_meta(ckpt: Path) -> dict[str, Any]:
    """Return a checkpoint's meta.json, checked for what export and evaluation rely on."""
    try:
        meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrainingError(f"checkpoint {ckpt} has no readable meta.json ({exc}); refusing to use it") from exc
    if not isinstance(meta, dict):
        raise TrainingError(f"checkpoint {ckpt}/meta.json is not a JSON object; refusing to use it")
    if meta.get("format", READABLE_FORMATS[0]) not in READABLE_FORMATS:
        raise TrainingError(f"checkpoint {ckpt} has format {meta.get('format')!r}; this toolkit reads {READABLE_FORMATS}")
    missing = [k for k in REQUIRED_META if meta.get(k) in (None, "", [])]
    layer_ids = (meta.get("draft_config") or {}).get("aux_layer_ids") if isinstance(meta.get("draft_config"), dict) else None
    if not layer_ids:
        missing.append("draft_config.aux_layer_ids")
    if missing:
        raise TrainingError(f"checkpoint {ckpt} metadata lacks {missing}; refusing a draft that cannot be served right")
    return meta


def layer_ids(meta: dict[str, Any]) -> list[int]:
    """Return the target layers (inputs, training.target.layers.CONVENTION) the checkpoint's draft fuses."""
    ids = [int(i) for i in meta["draft_config"]["aux_layer_ids"]]
    n = (meta.get("target_config") or {}).get("num_hidden_layers")
    return check_layer_ids(ids, int(n)) if n else ids


def read_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor]]:
    """Return (checkpoint dir, meta, weights) of a checkpoint or a run's latest, all checked."""
    ckpt = resolve_checkpoint(path)
    meta = read_meta(ckpt)
    weights = read_weights(ckpt / WEIGHTS)
    absent = [k for k in kind_of_meta(meta).checkpoint_weights if k not in weights]
    if absent:
        raise TrainingError(f"checkpoint {ckpt} lacks weights {absent}; refusing to use it")
    return ckpt, meta, weights


def load_checkpoint_draft(ckpt: str | Path, target_dir: str | Path | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Return (draft with the checkpoint's weights, its meta); embeddings from the target when reachable."""
    path, meta, weights = read_checkpoint(ckpt)
    draft = kind_of_meta(meta).from_checkpoint(meta["draft_config"], weights, target_dir or meta.get("target_dir"), path)
    return draft, meta


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """Return the optimizer/scheduler/RNG/data-position state saved with a checkpoint.

    Read with `weights_only=True`: only tensors and plain values unpickle, so a planted file
    cannot run code. A file that needs more (another tool's, or tampered with) is refused.
    """
    path = ckpt / TRAINER_STATE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise TrainingError(
            f"{path} holds objects other than tensors and plain values, which only a full unpickling could "
            "load, and that can run code: refusing it. It was not written by this toolkit, or was tampered "
            f"with. Resume from another checkpoint of the run (move {ckpt.name} aside and point "
            "checkpoints/latest.json at an earlier step-* folder), or start a new run in another out; "
            f"its weights ({WEIGHTS}) are safe to export as they are"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise TrainingError(f"{path} is unreadable ({exc}); resume from an earlier checkpoint") from exc
    missing = [k for k in TRAINER_STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise TrainingError(f"{path} lacks {missing}: not a trainer state of this toolkit; resume from an earlier checkpoint")
    return state


def rng_state() -> dict[str, Any]:
    """Return every RNG state a resumed run must restore to continue bit-identically."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states saved by `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
