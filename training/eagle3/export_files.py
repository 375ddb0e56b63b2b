"""An EAGLE-3 checkpoint as an export's two files, in one of its layouts (training/eagle3/layouts/): what
the layout needs to know of the target gathered, the weights checked, and the files refused when no
engine would serve them as trained. training.export reads the checkpoint and publishes the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.eagle3.layouts import ExportSource, layout_named
from training.eagle3.model import DraftConfig
from training.eagle3.weights import check_servable, header_dtype
from training.errors import ModelMismatchError, TrainingError
from training.target.config import is_hub_id, read_target_config
from training.target.head import load_embeddings


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


def _verifier(meta: dict[str, Any], verifier: str | None) -> str:
    """Return the verifier for the speculators config: the one given, else the target's recorded name.

    vLLM resolves `verifier.name_or_path` as a Hub id; a local folder is written only when nothing
    better is known, and `curator export` and `curator doctor` then say to pass --verifier.
    """
    if verifier:
        return verifier
    name = str((meta.get("target_config") or {}).get("_name_or_path") or "")
    return name if is_hub_id(name) else str(meta["target_dir"])


def export_files(
    ckpt: Path, meta: dict[str, Any], weights: dict[str, torch.Tensor], ids: list[int], fmt: str, *,
    verifier: str | None, target_dir: str | Path | None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Return (file weights, config.json) of the checkpoint in layout `fmt`; `ids` its layers as layer inputs.

    `verifier` is the target's Hub id for the speculators layout; `target_dir` overrides where the
    target's embeddings are read from (speculators layout) when the recorded folder moved.
    """
    layout = layout_named(fmt)
    cfg = DraftConfig.from_dict(meta["draft_config"])
    check_servable(weights, cfg, f"checkpoint {ckpt}")
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
    return file_weights, config
