"""Export a trained draft for serving in one of its kind's layouts, and publish the folder whole.

What each layout writes is its kind's business (EAGLE-3's: training/eagle3/layouts/, reached through
the draft-kind registry); this module does what every export shares: read and check the checkpoint,
ask its kind for the files, and publish the folder safely (training.io.publish, as build-mix
publishes a mix): one export at a time per output (a lock beside it), the staging folders of killed
exports swept, the new folder swapped into place whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from training.drafts.kind import ExportRequest
from training.drafts.registry import formats, kind_of_format, kind_of_meta
from training.train.checkpoint import layer_ids as checkpoint_layer_ids
from training.train.checkpoint import read_checkpoint
from training.errors import TrainingError
from training.io.atomic import give_default_mode
from training.io.diskspace import named_disk_full
from training.io.export_folder import CONFIG_FILE, WEIGHTS_FILE
from training.io.outlock import OutputLock
from training.io.publish import Publisher
from training.target.config import is_hub_id

__all__ = ["export_checkpoint", "formats", "is_hub_id"]


def export_checkpoint(
    ckpt_dir: str | Path, out_dir: str | Path, fmt: str = "sglang", *, verifier: str | None = None,
    target_dir: str | Path | None = None,
) -> Path:
    """Write the checkpoint (or a run's latest) as a servable draft in `fmt`; return `out_dir`.

    `verifier` is the target's Hub id for the speculators layout; `target_dir` overrides where the
    target's embeddings are read from (speculators layout) when the recorded folder moved.
    """
    fmt_kind = kind_of_format(fmt)  # an unknown --format is named before the checkpoint is read
    ckpt, meta, weights = read_checkpoint(ckpt_dir)
    kind = kind_of_meta(meta)
    if kind is not fmt_kind:  # one kind owns a format (register refuses a second)
        raise TrainingError(f"checkpoint {ckpt} holds a {kind.name} draft, which exports as {', '.join(kind.formats)}, "
                            f"not {fmt!r}")
    file_weights, config = kind.export(ExportRequest(ckpt, meta, weights, checkpoint_layer_ids(meta), fmt,
                                                     verifier, target_dir))
    return _publish(Path(out_dir).resolve(), file_weights, config)


STAGE_TAG = "export"  # a new export being written beside NAME: `.NAME.export.tmp-PID` (training.io.publish)


def _export_file(name: str) -> bool:
    # safetensors writes the weights to a `.tmpXXXXXX` file and renames it: a kill mid-write leaves one
    return name in (CONFIG_FILE, WEIGHTS_FILE) or _SAFETENSORS_TMP.fullmatch(name) is not None


def _holds_an_export(folder: Path) -> bool:
    """Whether a leftover folder by an export's names holds nothing but an export's files (else it is the user's: kept)."""
    return all(_export_file(p.name) and not p.is_symlink() and p.is_file() for p in folder.iterdir())


def publisher(out: Path) -> Publisher:
    return Publisher.of(out, STAGE_TAG, owns=_holds_an_export)


def _publish(out: Path, weights: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """Write the export in a staging folder beside `out` and swap it into place, holding `out`'s lock."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # the lock lives beside `out` (which is replaced whole); a second export to the same folder is refused
    with OutputLock(out.parent, f".{out.name}.export.lock", "curator export", guards=out):
        pub = publisher(out)
        pub.remove_stale()  # under the lock: no live export of `out` owns any of them; may restore `out`
        _check_replaceable(out)
        # a full disk is said as such ("disk full at OUT: N bytes free"), and the staging folder goes with it
        with named_disk_full(out), pub.staged() as stage:
            save_file(weights, str(stage / WEIGHTS_FILE), metadata={"format": "pt"})
            give_default_mode(stage / WEIGHTS_FILE)  # safetensors' temp file is 0600: made 0644 as config.json is
            (stage / CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


_SAFETENSORS_TMP = re.compile(r"\.tmp[A-Za-z0-9_]{6,8}")


def _check_replaceable(out: Path) -> None:
    """Refuse an --out that is a file or a folder holding anything but an earlier export."""
    if not out.exists():
        return
    if not out.is_dir():
        raise TrainingError(f"--out {out} is a file; export into a new or empty directory")
    others = sorted(p.name for p in out.iterdir() if p.name not in {CONFIG_FILE, WEIGHTS_FILE})
    if others:
        raise TrainingError(
            f"--out {out} holds other files ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); "
            "export into a new or empty directory (only an earlier export is replaced)"
        )
