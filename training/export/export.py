"""Export a trained draft for serving in one of the layouts of training/eagle3/layouts/, and load any back.

What each layout writes is its own module's business (training/eagle3/layouts/sglang.py, speculators.py);
this module does what every export shares: read and check the checkpoint (finite weights, fc and
d2t as the config says), gather what the layout needs to know of the target, and publish the folder
safely (training.io.publish, as build-mix publishes a mix): one export at a time per output (a lock
beside it), the staging folders of killed exports swept, the new folder swapped into place whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from training.train.checkpoint import layer_ids as checkpoint_layer_ids
from training.train.checkpoint import read_checkpoint
from training.eagle3.load import CONFIG_FILE, WEIGHTS_FILE
from training.eagle3.model import DraftConfig
from training.eagle3.weights import check_servable, header_dtype
from training.errors import ModelMismatchError, TrainingError
from training.eagle3.layouts import FORMATS, ExportSource, layout_named
from training.io.atomic import give_default_mode
from training.io.diskspace import named_disk_full
from training.io.outlock import OutputLock
from training.io.publish import Publisher
from training.target.config import read_target_config
from training.target.head import load_embeddings

__all__ = ["FORMATS", "export_checkpoint", "is_hub_id"]



def _target_shape(meta: dict[str, Any]) -> tuple[str | None, int]:
    """Return (target class, layer count) recorded in the checkpoint, else read from the target."""
    cfg = meta.get("target_config") or {}
    if not cfg.get("num_hidden_layers") and Path(str(meta.get("target_dir", ""))).exists():
        cfg = read_target_config(meta["target_dir"])
    if not cfg.get("num_hidden_layers"):
        raise TrainingError("the checkpoint records no target layer count and its target_dir is gone; "
                            "the layer ids cannot be written for the engine")
    arch = (cfg.get("architectures") or [None])[0]
    return arch, int(cfg["num_hidden_layers"])


def is_hub_id(name: str) -> bool:
    """Return whether `name` reads as a Hub repository id (org/name), not a local path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists()


def _verifier(meta: dict[str, Any], verifier: str | None) -> str:
    """Return the verifier for the speculators config: the one given, else the target's recorded name.

    vLLM resolves `verifier.name_or_path` as a Hub id; a local folder is written only when nothing
    better is known, and `curator export` and `curator doctor` then say to pass --verifier.
    """
    if verifier:
        return verifier
    name = str((meta.get("target_config") or {}).get("_name_or_path") or "")
    return name if is_hub_id(name) else str(meta["target_dir"])


def export_checkpoint(
    ckpt_dir: str | Path, out_dir: str | Path, fmt: str = "sglang", *, verifier: str | None = None,
    target_dir: str | Path | None = None,
) -> Path:
    """Write the checkpoint (or a run's latest) as a servable draft in `fmt`; return `out_dir`.

    `verifier` is the target's Hub id for the speculators layout; `target_dir` overrides where the
    target's embeddings are read from (speculators layout) when the recorded folder moved.
    """
    layout = layout_named(fmt)
    ckpt, meta, weights = read_checkpoint(ckpt_dir)
    cfg = DraftConfig.from_dict(meta["draft_config"])
    check_servable(weights, cfg, f"checkpoint {ckpt}")
    ids = checkpoint_layer_ids(meta)
    if len(ids) != cfg.num_aux_layers:
        raise ModelMismatchError(f"checkpoint {ckpt} records {len(ids)} aux layers {ids} but its fc fuses "
                                 f"{cfg.num_aux_layers}; re-train or fix its meta.json")
    arch, num_layers = _target_shape(meta)
    source = ExportSource(
        draft=cfg, layer_inputs=ids, target_architecture=arch, target_layers=num_layers,
        target_config=meta.get("target_config") or {}, verifier=_verifier(meta, verifier),
        speculative_tokens=min(3, int(meta.get("ttt_steps") or 3)),
        provenance={"checkpoint": str(ckpt.resolve()), "step": meta["step"], "target_dir": meta["target_dir"],
                    "vocab": meta.get("vocab", {}), "ttt_steps": meta.get("ttt_steps"),
                    # the layers the draft was trained on, as layer inputs, whatever the engine's numbering
                    "aux_layer_inputs": ids, "split": meta.get("split"),
                    # the EAGLE-3.1 norms it was trained with: the doctor holds every engine's reading to them
                    "variant": cfg.variant()},
    )
    config = layout.config(source)  # refuses what the layout's engines cannot serve as trained
    embeddings = None
    if layout.carries_embeddings:
        origin = target_dir or meta["target_dir"]
        if not Path(str(origin)).exists():
            raise TrainingError(f"the target folder {origin} is gone; pass --target with the target's model folder "
                                f"(the {layout.name} layout carries the target's embeddings)")
        embeddings = load_embeddings(origin)
    file_weights = layout.file_weights(weights, embeddings)
    # never write an export that load_draft and the doctor would refuse (the check they share)
    problems = [*layout.config_problems(config),
                *layout.tensor_problems(config, {k: (tuple(v.shape), header_dtype(v)) for k, v in file_weights.items()})]
    if problems:
        raise ModelMismatchError(f"checkpoint {ckpt} would export as a draft no engine serves as trained: "
                                 f"{'; '.join(problems)}")
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
