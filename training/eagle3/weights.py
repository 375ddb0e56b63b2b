"""Whether a draft's weights can be served: finite, and shaped as its config says (fc, lm_head, d2t/t2d).

`curator export` refuses a checkpoint that fails, `load_draft` (so `curator eval`) an export, and
`curator doctor` reports the same problems in its table: a diverged run (NaN/inf weights) or a
mis-shaped fc would otherwise be served, or fail later with an unnamed error.
"""

from __future__ import annotations

import torch

from training.eagle3.model import DraftConfig
from training.errors import ModelMismatchError
from training.io.weights import nonfinite_tensors


# torch dtypes under the names a safetensors header gives them (what training/eagle3/config_check.py judges)
_HEADER_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                  torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                  torch.bool: "BOOL"}


def header_dtype(tensor: torch.Tensor) -> str:
    """Return a tensor's dtype as a safetensors header names it (one it has no name for here keeps its torch name)."""
    return _HEADER_DTYPES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))


def vocab_map_problem(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab: int) -> str | None:
    """Return what is wrong with d2t [draft_vocab] (d2t[i] = target id - i) and t2d [vocab], or None."""
    if d2t.dim() != 1 or d2t.is_floating_point():
        return f"d2t is a {d2t.dtype} tensor of shape {list(d2t.shape)}, expected integer [draft_vocab_size]"
    if t2d is not None and tuple(t2d.shape) != (vocab,):
        return f"t2d is {list(t2d.shape)}, expected [vocab_size={vocab}]"
    target_ids = d2t.long() + torch.arange(d2t.numel())
    if d2t.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab):
        return (f"d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, outside the "
                f"target vocabulary 0..{vocab - 1} (d2t[i] must be target_id - i)")
    if target_ids.unique().numel() != d2t.numel():
        return "d2t maps two draft ids to the same target id"
    return None


def check_servable(weights: dict[str, torch.Tensor], cfg: DraftConfig, where: str) -> None:
    """Raise ModelMismatchError naming every reason the weights (toolkit names) cannot be served."""
    bad = nonfinite_tensors(weights)
    if bad:
        raise ModelMismatchError(
            f"{where} holds NaN or inf in {', '.join(bad[:5])}{' and more' if len(bad) > 5 else ''}: the training "
            "run diverged (lower the learning rate, or use an earlier checkpoint); refusing to serve it")
    h, th = cfg.hidden_size, int(cfg.target_hidden_size or cfg.hidden_size)
    expected = {"fc.weight": (h, cfg.num_aux_layers * th), "lm_head.weight": (cfg.draft_vocab_size, h),
                "norm.weight": (h,), "d2t": (cfg.draft_vocab_size,), "input_norm.weight": (cfg.num_aux_layers * th,),
                **{f"fc_norm.{i}.weight": (th,) for i in range(cfg.num_aux_layers)}}
    wrong = [f"{name} is {list(weights[name].shape)}, expected {list(shape)}"
             for name, shape in expected.items() if name in weights and tuple(weights[name].shape) != shape]
    if wrong:
        raise ModelMismatchError(
            f"{where} does not fit its config ({'; '.join(wrong)}; fc takes {cfg.num_aux_layers} aux states of "
            f"{th}); refusing to export a draft no engine would load as trained")
    if "d2t" in weights:
        problem = vocab_map_problem(weights["d2t"], weights.get("t2d"), cfg.vocab_size)
        if problem:
            raise ModelMismatchError(f"{where}: {problem}; refusing to serve a draft that proposes other tokens")
