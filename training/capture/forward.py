"""The target's forward for capture: its base run under pre-hooks on the requested decoder layers.

Layer id L is the input of decoder layer L (`output_hidden_states[L]` in transformers; training.target.layers).
Only the requested layers are kept, and the base (not the LM head) runs, so no logits are computed;
the final state is the last layer's output after the final norm.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.errors import ModelMismatchError, TrainingError
from training.target.layers import check_layer_ids


def text_config(config: Any) -> Any:
    """Return the language-model part of a (possibly multimodal) transformers config."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


def base_and_layers(model: Any) -> tuple[Any, Any, Any]:
    base = getattr(model, "model", model)
    base = getattr(base, "language_model", base)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise ModelMismatchError(
            f"{type(model).__name__} has no `.model.layers` and `.model.norm`; only decoder-only causal LMs are supported"
        )
    return base, layers, norm


@dataclass
class CapturedStates:
    """States of one batch: aux [B, T, n_aux*H] (layer order as requested), final [B, T, H] or None."""

    aux: torch.Tensor
    final: torch.Tensor | None
    final_prenorm: torch.Tensor | None = None  # [B, T, H]: the final norm's input (speculators' final state)


@torch.no_grad()
def capture_batch(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer_ids: list[int],
    with_final: bool = True,
    with_prenorm: bool = False,
) -> CapturedStates:
    """Return the aux states (inputs of `layer_ids`) and the final normed state for a batch; writes nothing.

    This is the online mode: the trainer calls it on the target beside the draft.
    """
    base, layers, norm = base_and_layers(model)
    n = len(layers)
    layer_ids = check_layer_ids(layer_ids, n)
    captured: dict[int, torch.Tensor] = {}

    def keep(idx: int) -> Callable[..., None]:
        def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
            captured[idx] = args[0] if args else kwargs["hidden_states"]

        return hook

    # Id N (the last layer's output, pre-norm) is the input of the final norm.
    wanted = set(layer_ids) | ({n} if with_prenorm else set())
    modules = {i: (layers[i] if i < n else norm) for i in wanted}
    handles = [m.register_forward_pre_hook(keep(i), with_kwargs=True) for i, m in modules.items()]
    try:
        out = base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    final = out.last_hidden_state if with_final else None
    device = final.device if final is not None else captured[layer_ids[-1]].device
    aux = torch.cat([captured[i].to(device) for i in layer_ids], dim=-1)
    return CapturedStates(aux=aux, final=final, final_prenorm=captured[n].to(device) if with_prenorm else None)


def sample_finite(states: CapturedStates, lengths: list[int]) -> list[bool]:
    """Return, per sample of a batch, whether its states (up to its length) are all finite.

    One reduction on the device where the states are, instead of a pass over the host copy.
    """
    bad = ~torch.isfinite(states.aux).all(dim=-1)  # (B, T)
    if states.final is not None:
        bad |= ~torch.isfinite(states.final).all(dim=-1)
    positions = torch.arange(bad.shape[1], device=bad.device)[None, :]
    valid = positions < torch.tensor(lengths, device=bad.device)[:, None]
    return (~(bad & valid).any(dim=1)).tolist()


def pad_batch(seqs: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return right-padded ids [B, T] and attention mask [B, T]."""
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def load_target(model_path: str | Path, device: str | torch.device | None = None) -> tuple[Any, Any]:
    """Return (model in eval mode, tokenizer): bf16 on GPU, float32 on CPU, sdpa attention.

    With several GPUs visible to one process (no torchrun) and accelerate installed, the model is
    spread over them with device_map="auto", for targets larger than one GPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_path)
    if not (path / "config.json").exists():
        raise TrainingError(f"{path} has no config.json; pass the target model's directory")
    tokenizer = AutoTokenizer.from_pretrained(path)
    cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if cuda else torch.float32, "attn_implementation": "sdpa"}
    spread = cuda and device is None and torch.cuda.device_count() > 1 and importlib.util.find_spec("accelerate")
    if spread:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if not spread:
        model.to(device or ("cuda" if cuda else "cpu"))  # type: ignore[arg-type]  # transformers types .to() as a PreTrainedModel's
    model.eval()
    return model, tokenizer


