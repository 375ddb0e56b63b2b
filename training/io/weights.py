"""Reading a safetensors weights file whole, a damaged or missing one named as such: checkpoints and
exports both go through here; non-finite tensors named."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from training.errors import TrainingError


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Return the tensors of a safetensors file; a missing or damaged file is a TrainingError."""
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise TrainingError(f"{path} is not a readable safetensors file ({exc}); was it copied completely?") from exc


def nonfinite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Return the names of the floating-point tensors that hold NaN or inf (one host sync for all)."""
    names = [k for k, v in tensors.items() if v.is_floating_point()]
    if not names:
        return []
    finite = torch.stack([torch.isfinite(tensors[k]).all() for k in names]).cpu()
    return [k for k, ok in zip(names, finite.tolist()) if not ok]
