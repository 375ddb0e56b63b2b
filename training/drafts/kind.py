"""What a draft kind is to the toolkit: the one Protocol the trainer, checkpoints, export and eval call.

A kind (EAGLE-3 today; P-EAGLE, a DFlash-style block draft next) owns its model, its objective, its
checkpoint weights, its export layouts and its proposer; the core knows none of them and asks the
registry (`training.drafts.registry`) for the kind a run names or a file records. As speculators'
`@register` + `from_training_args`: a kind is built from the run's options (`TrainConfig.to_dict()`,
read by key so that a kind may add its own), never from a class the core imports.

The shared parts stay with the core: the hidden-state stores and packed batches (`training.feed`), the
draft vocabulary (`training.target.draft_vocab`), the checkpoint folder and the export folder's publishing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: the registry loads without torch (curator doctor's usage errors stay fast)
    import torch
    import torch.nn as nn

    from training.eagle3.layouts.base import Layout
    from training.eval.prompts import HeldOutSplit
    from training.eval.proposers import Proposer
    from training.feed.batches import States
    from training.feed.packing import PackedBatch
    from training.target.draft_vocab import DraftVocab
    from training.target.head import TargetHead

# A checkpoint written before kinds were recorded holds an EAGLE-3 draft: its meta.json has no `draft_kind`.
DEFAULT_KIND = "eagle3"


class StartDraft(Protocol):
    """A draft from elsewhere that a run starts from (`init_from=`): it keeps its own vocabulary."""

    def vocab(self, counts: torch.Tensor, samples_counted: int, samples_skipped: int) -> DraftVocab:
        """Return the draft's own vocabulary, with its coverage of the run's counted tokens [target_vocab]."""


@dataclass(frozen=True)
class BuildArgs:
    """What a kind builds a draft from at the start of a run (`DraftKind.build`)."""

    train_args: Mapping[str, Any]  # the run's options, TrainConfig.to_dict()
    target_config: dict[str, Any]  # the target's config.json, its language model's part
    head: TargetHead  # the target's final norm and lm_head
    vocab: DraftVocab
    aux_layer_ids: Sequence[int]  # the store's layers, as layer inputs (training.target.layers.CONVENTION)
    start: StartDraft | None  # init_from's draft, on a fresh run
    resumed_config: dict[str, Any] | None  # the checkpoint's draft_config, when a run started from elsewhere resumes


@dataclass(frozen=True)
class ExportRequest:
    """A checkpoint read and checked by training.export, to be written in one of the kind's formats."""

    checkpoint: Path
    meta: dict[str, Any]
    weights: dict[str, torch.Tensor]
    layer_inputs: list[int]  # the layers the draft was trained on, checked against the target's depth
    fmt: str
    verifier: str | None
    target_dir: str | Path | None


@dataclass(frozen=True)
class HeldOutArgs:
    """How the trainer evaluates a draft on held-out samples: this rank's share, reduced over ranks."""

    ttt_steps: int
    step_weight: float
    rank: int
    world: int
    reduce: Callable[[torch.Tensor], torch.Tensor]
    batch_size: int
    max_length: int
    autocast: bool


class DraftKind(Protocol):
    """One draft kind: every operation the core runs on a draft of it.

    `name` is what `draft_kind=` takes and what checkpoints record. The draft is an `nn.Module` of the
    kind's own class; the core moves it, counts its parameters and loads checkpoint weights into it
    (`load_state_dict(strict=False)`), and calls nothing else on it.
    """

    name: str
    checkpoint_weights: tuple[str, ...]  # weights a checkpoint of this kind must hold
    formats: tuple[str, ...]  # its export layouts' names (`curator export --format`)
    # those whose readers the doctor checks (EAGLE-3's Layout contract); a kind may have none yet
    layouts: Mapping[str, Layout]

    @property
    def n_sums(self) -> int:
        """Return how many metric sums per TTT step the objective returns and `summarize` reads."""

    def owns(self, draft: nn.Module) -> bool:
        """Whether a loaded draft is this kind's (how `curator eval` finds the kind of the draft it loaded)."""

    # training
    def start_from(self, path: str, target_dir: str, target_config: dict[str, Any], vocab_size: int,
                   aux_layer_ids: list[int], train_args: Mapping[str, Any]) -> StartDraft:
        """Return the export at `path` as the start of a run (init_from=), or raise naming the misfit."""

    def build(self, args: BuildArgs) -> nn.Module:
        """Return a new draft for the run (on the CPU), its vocabulary and the target's embeddings set."""

    def config_of(self, draft: nn.Module) -> dict[str, Any]:
        """Return the draft's config as checkpoints record it (`draft_config`, with `aux_layer_ids`)."""

    def prepare(self, device: torch.device) -> None:
        """Set up what the kind's kernels need on `device` before the loop."""

    def objective(self, draft: nn.Module) -> nn.Module:
        """Return the module whose forward is one micro-batch's loss (DDP wraps it)."""

    def targets(self, batch: PackedBatch, head: TargetHead, draft: nn.Module) -> Any:
        """Return what the target says about a batch (outside autocast: the head runs in the data dtype)."""

    def step(self, objective: nn.Module, batch: PackedBatch, targets: Any, step_scale: torch.Tensor,
             ttt_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (loss, metric sums [ttt_steps, n_sums]) of one micro-batch, under the caller's autocast."""

    def summarize(self, sums: torch.Tensor, step_weight: float) -> dict[str, Any]:
        """Return the logged metrics (loss, acc, accept_length, ...) from metric sums."""

    def held_out(self, draft: nn.Module, store: States, ids: Sequence[str], head: TargetHead,
                 args: HeldOutArgs) -> dict[str, Any]:
        """Return the eval record's metrics of `draft` on this rank's share of `ids`, reduced over ranks."""

    def trainable_weights(self, draft: nn.Module) -> dict[str, torch.Tensor]:
        """Return the weights a checkpoint keeps (the trained ones: no embedding shared with the target)."""

    # checkpoints, export and eval
    def from_checkpoint(self, draft_config: dict[str, Any], weights: dict[str, torch.Tensor],
                        target_dir: str | Path | None, where: Path) -> nn.Module:
        """Return the checkpoint's draft, its weights loaded; embeddings from `target_dir` when it exists."""

    def export(self, request: ExportRequest) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Return (file weights, config.json) of the checkpoint in `request.fmt`, refusing what no engine serves."""

    def recognises(self, config: dict[str, Any]) -> bool:
        """Whether an exported config.json is one of this kind's."""

    def load_export(self, root: Path, config: dict[str, Any], target_dir: str | Path | None) -> nn.Module:
        """Return the exported draft in `root` (float32, eval mode), refusing a broken one."""

    def verifier(self, config: dict[str, Any]) -> str | None:
        """Return the target an export names for its server to load, if its layout names one."""

    def proposer(self, draft: nn.Module, num_draft_tokens: int | None) -> Proposer:
        """Return the draft as the proposer speculative decoding asks for draft tokens."""

    def offline_estimate(self, draft: nn.Module, store: str | Path, target_dir: str | Path, split: HeldOutSplit,
                         **options: Any) -> dict[str, Any]:
        """Return the offline estimates on the store's held-out samples (EAGLE-3's: training/eagle3/offline.py)."""
