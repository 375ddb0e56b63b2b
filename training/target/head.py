"""The target's lm_head and input embeddings, read from its safetensors alone.

Training a draft needs the target's logits (lm_head over the stored final hidden state) and its
token embeddings, nothing else: loading a 1T-parameter target to get two [V, H] matrices is not
an option. Single-file and sharded checkpoints (model.safetensors.index.json) are both read, and
a target with tied embeddings (or no lm_head tensor) uses its embedding matrix as the head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import safe_open

from training.errors import ModelMismatchError, TrainingError
from training.target.config import read_target_config

LM_HEAD_SUFFIX = "lm_head.weight"
EMBED_SUFFIX = "embed_tokens.weight"


def tensor_files(target_dir: str | Path) -> dict[str, Path]:
    """Return tensor name -> safetensors file, from the shard index or the single-file header."""
    root = Path(target_dir)
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return {name: root / fname for name, fname in weight_map.items()}
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise TrainingError(f"{root} holds no safetensors weights; the draft needs the target's lm_head and embeddings")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            out.update({k: f for k in h.keys()})
    return out


def _pick(names: dict[str, Path], suffix: str) -> str | None:
    """Return the tensor name ending in `suffix` closest to the top level (shortest), if any."""
    hits = sorted((n for n in names if n == suffix or n.endswith("." + suffix)), key=len)
    return hits[0] if hits else None


def _load(files: dict[str, Path], name: str, dtype: torch.dtype | None, device: str | torch.device) -> torch.Tensor:
    with safe_open(str(files[name]), framework="pt", device="cpu") as h:
        t = h.get_tensor(name)
    return t.to(device=device, dtype=dtype or t.dtype)


def load_embeddings(
    target_dir: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """Return the target's input embeddings [V, H]."""
    files = tensor_files(target_dir)
    name = _pick(files, EMBED_SUFFIX)
    if name is None:
        raise ModelMismatchError(f"no '*{EMBED_SUFFIX}' tensor in {target_dir}; is it a decoder-only LM?")
    return _load(files, name, dtype, device)


def load_lm_head(
    target_dir: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """Return the target's output head [V, H] (its embeddings when they are tied)."""
    cfg = read_target_config(target_dir, required=())  # only whether the head is tied
    files = tensor_files(target_dir)
    name = None if cfg.get("tie_word_embeddings") else _pick(files, LM_HEAD_SUFFIX)
    name = name or _pick(files, EMBED_SUFFIX)
    if name is None:
        raise ModelMismatchError(f"neither '*{LM_HEAD_SUFFIX}' nor '*{EMBED_SUFFIX}' found in {target_dir}")
    return _load(files, name, dtype, device)


class TargetHead(nn.Module):
    """The target's lm_head as a frozen module: final hidden state [.., H] -> logits [.., V]."""

    weight: torch.Tensor  # a buffer, [V, H]

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach())  # [V, H]

    @classmethod
    def from_pretrained(
        cls, target_dir: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> TargetHead:
        """Return the head read from the target's safetensors."""
        return cls(load_lm_head(target_dir, dtype=dtype, device=device))

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.weight.shape[1])

    def forward(self, final: torch.Tensor) -> torch.Tensor:
        """Return logits [.., V] for final (normed) hidden states [.., H]."""
        if final.shape[-1] != self.hidden_size:
            raise ModelMismatchError(
                f"final hidden width {final.shape[-1]} does not match the target head's {self.hidden_size}"
            )
        return final.to(self.weight.dtype) @ self.weight.T
