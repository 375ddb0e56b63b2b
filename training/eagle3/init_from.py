"""`init_from`: start a run from an existing EAGLE-3 or EAGLE-3.1 draft instead of a fresh one.

Users adapt a published draft to their traffic this way. The draft is an export folder in either
layout (SGLang/SpecForge `LlamaForCausalLMEagle3`, speculators `Eagle3Speculator`), read by
training.eagle3.load.load_draft, so it is checked as an export is (finite, shaped as its config
says, its norms as its format defines them). The run keeps the draft's shape, vocabulary and norms:
- its decoder shape, rope and draft vocabulary come from the draft (its lm_head rows are its d2t's);
- the target must be the draft's (hidden size, vocabulary), and the store must hold the layers the
  draft fuses, in the toolkit's numbering (the layout's main reader's, resolved with the target's config);
- the run's norm options must equal the draft's (train_config.json records what the run trains, so a
  mismatch is refused with the keys to set rather than silently changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.eagle3.model import VARIANT_KEYS, DraftConfig, Eagle3Draft
from training.target.draft_vocab import DraftVocab
from training.errors import ModelMismatchError, TrainingError


@dataclass
class InitDraft:
    """The draft a run starts from: its config and its trainable weights (toolkit names, float32, CPU)."""

    path: Path
    config: DraftConfig
    weights: dict[str, torch.Tensor]

    def vocab(self, counts: torch.Tensor, samples_counted: int, samples_skipped: int) -> DraftVocab:
        """Return the draft's own vocabulary, with its coverage of the run's counted tokens [target_vocab]."""
        ids = (torch.arange(self.config.draft_vocab_size) + self.weights["d2t"].long()).long()
        total = int(counts.sum())
        return DraftVocab(draft_ids=ids, target_vocab_size=int(counts.shape[0]),
                          coverage=float(counts[ids].sum()) / total if total else 0.0, tokens_counted=total,
                          samples_counted=samples_counted, distinct_tokens=int((counts > 0).sum()),
                          samples_skipped=samples_skipped)


def read_init_draft(path: str | Path, target_dir: str | Path, target_config: dict[str, Any], vocab_size: int,
                    store_layers: list[int], variant: dict[str, bool], intermediate_size: int | None) -> InitDraft:
    """Return the export at `path` as the start of a run on this target and store, or raise naming the misfit."""
    from training.eagle3.load import load_draft

    root = Path(path)
    if not root.is_dir():
        raise TrainingError(f"init_from={root} is not a folder; give an exported EAGLE-3 draft (config.json + "
                            "model.safetensors, SGLang or speculators layout)")
    draft: Eagle3Draft = load_draft(root, target_dir)
    cfg = draft.config
    problems = []
    hidden = int(target_config.get("hidden_size") or 0)
    if cfg.hidden_size != hidden or cfg.target_hidden_size != hidden:
        problems.append(f"its width is {cfg.hidden_size} (aux states {cfg.target_hidden_size}), the target's {hidden}")
    if cfg.vocab_size != vocab_size:
        problems.append(f"its vocabulary is {cfg.vocab_size}, the target's {vocab_size}")
    if list(cfg.aux_layer_ids) != list(store_layers):
        problems.append(f"it fuses the inputs of layers {list(cfg.aux_layer_ids)}, the store holds {list(store_layers)}")
    if intermediate_size is not None and intermediate_size != cfg.intermediate_size:
        problems.append(f"its intermediate_size is {cfg.intermediate_size}, the run asks {intermediate_size}")
    if problems:
        raise ModelMismatchError(f"init_from={root} does not fit this run: {'; '.join(problems)}")
    differs = {k: cfg.variant()[k] for k in VARIANT_KEYS if cfg.variant()[k] != bool(variant.get(k))}
    if differs:
        settings = " ".join(f"{k}={str(v).lower()}" for k, v in differs.items())
        raise TrainingError(f"init_from={root} was trained with other norms than the run's options; set {settings} "
                            "(the run keeps the draft's norms, and train_config.json records them)")
    weights = {k: v.detach().float().cpu() for k, v in draft.trainable_state_dict().items()}
    return InitDraft(path=root.resolve(), config=cfg, weights=weights)
