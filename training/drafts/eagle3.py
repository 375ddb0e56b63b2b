"""EAGLE-3 (and its EAGLE-3.1 norms) as a draft kind: the built-in registration of training/eagle3/.

Each operation hands over to the module of training/eagle3/ that does it; this adapter holds no EAGLE-3
logic of its own, only which function answers which question the core asks. Those modules are imported
inside the operations: the registry is imported by `curator doctor` and the engines' launch checks,
whose usage errors load no torch (only the layouts, which read JSON, are imported here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.eagle3.layouts import LAYOUTS, Layout, layout_of
from training.eagle3.layouts.base import VARIANT_KEYS
from training.errors import ModelMismatchError

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from training.drafts.kind import BuildArgs, ExportRequest, HeldOutArgs, StartDraft
    from training.eagle3.init_from import InitDraft
    from training.eagle3.model import Eagle3Draft
    from training.eval.prompts import HeldOutSplit
    from training.eval.proposers import Proposer
    from training.feed.batches import States
    from training.feed.packing import PackedBatch
    from training.target.head import TargetHead


def _eagle3(draft: nn.Module) -> Eagle3Draft:
    from training.eagle3.model import Eagle3Draft

    if not isinstance(draft, Eagle3Draft):
        raise ModelMismatchError(f"{type(draft).__name__} is not an EAGLE-3 draft")
    return draft


def _init(start: StartDraft | None) -> InitDraft | None:
    from training.eagle3.init_from import InitDraft

    if start is not None and not isinstance(start, InitDraft):
        raise ModelMismatchError(f"an EAGLE-3 run cannot start from {type(start).__name__}")
    return start


def _variant(train_args: Mapping[str, Any]) -> dict[str, bool]:
    """Return the EAGLE-3.1 norms the run's options turn on (from the run config's dict)."""
    return {name: bool(train_args.get(name)) for name in VARIANT_KEYS}


class Eagle3Kind:
    """The EAGLE-3 draft kind: one decoder layer over the fused aux states, trained with TTT."""

    name = "eagle3"
    # what every EAGLE-3 checkpoint holds: without one of these no layout can be written
    checkpoint_weights: tuple[str, ...] = ("fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
    layouts: Mapping[str, Layout] = LAYOUTS
    formats = tuple(LAYOUTS)

    @property
    def n_sums(self) -> int:
        from training.eagle3.objective import N_SUMS

        return N_SUMS

    def owns(self, draft: nn.Module) -> bool:
        from training.eagle3.model import Eagle3Draft

        return isinstance(draft, Eagle3Draft)

    def start_from(self, path: str, target_dir: str, target_config: dict[str, Any], vocab_size: int,
                   aux_layer_ids: list[int], train_args: Mapping[str, Any]) -> StartDraft:
        from training.eagle3.init_from import read_init_draft

        return read_init_draft(path, target_dir, target_config, vocab_size, aux_layer_ids, _variant(train_args),
                               train_args.get("intermediate_size"))

    def build(self, args: BuildArgs) -> nn.Module:
        from training.eagle3.model import DraftConfig, Eagle3Draft
        from training.target.head import load_embeddings

        init = _init(args.start)
        if init is not None:  # a draft from elsewhere keeps its shape
            draft_cfg = init.config
        elif args.resumed_config is not None:  # ... and so does one resumed from it
            draft_cfg = DraftConfig.from_dict(args.resumed_config)
        else:
            draft_cfg = DraftConfig.from_target_config(
                {**args.target_config, "vocab_size": args.head.vocab_size},
                draft_vocab_size=args.vocab.size,
                aux_layer_ids=list(args.aux_layer_ids),
                intermediate_size=args.train_args.get("intermediate_size"),
                variant=_variant(args.train_args),
            )
        draft = Eagle3Draft(draft_cfg)
        draft.load_embeddings(load_embeddings(str(args.train_args["target"])))
        draft.set_vocab(args.vocab.d2t, args.vocab.t2d)
        if init is not None:
            draft.load_state_dict(init.weights, strict=False)  # every trainable weight (load_draft checked them)
        elif args.train_args.get("init_lm_head_from_target", True):
            draft.init_lm_head_from_target(args.head.weight)
        return draft

    def config_of(self, draft: nn.Module) -> dict[str, Any]:
        return _eagle3(draft).config.to_dict()

    def prepare(self, device: torch.device) -> None:
        from training.eagle3 import kernels

        kernels.enable_if_working(device)  # compiled RMSNorm/soft-CE on CUDA (TRAINING_COMPILE=0: eager)

    def objective(self, draft: nn.Module) -> nn.Module:
        from training.eagle3.objective import PackedTTTObjective

        return PackedTTTObjective(_eagle3(draft))

    def targets(self, batch: PackedBatch, head: TargetHead, draft: nn.Module) -> Any:
        from training.eagle3.objective import packed_target_signals

        d = _eagle3(draft)
        return packed_target_signals(batch, head, d.draft_ids(), d.t2d)

    def step(self, objective: nn.Module, batch: PackedBatch, targets: Any, step_scale: torch.Tensor,
             ttt_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        from training.eagle3.objective import packed_call

        return packed_call(objective, batch, targets, step_scale, ttt_steps)

    def summarize(self, sums: torch.Tensor, step_weight: float) -> dict[str, Any]:
        from training.eagle3.objective import summarize

        return summarize(sums, step_weight)

    def held_out(self, draft: nn.Module, store: States, ids: Sequence[str], head: TargetHead,
                 args: HeldOutArgs) -> dict[str, Any]:
        from training.eagle3.objective import metric_sums, summarize
        from training.eagle3.simulate import simulated_eval

        d = _eagle3(draft)
        sums = metric_sums(d, store, list(ids)[args.rank::args.world], args.ttt_steps, head,
                           batch_size=args.batch_size, max_length=args.max_length, autocast=args.autocast)
        record = summarize(args.reduce(sums), args.step_weight)
        # decoding as the engine runs it (a chain of ttt_steps): the figure that predicts serving
        record.update(simulated_eval(d, store, ids, args.ttt_steps, rank=args.rank, world=args.world,
                                     reduce=args.reduce, batch_size=args.batch_size, max_length=args.max_length,
                                     autocast=args.autocast))
        return record

    def trainable_weights(self, draft: nn.Module) -> dict[str, torch.Tensor]:
        return _eagle3(draft).trainable_state_dict()

    def from_checkpoint(self, draft_config: dict[str, Any], weights: dict[str, torch.Tensor],
                        target_dir: str | Path | None, where: Path) -> nn.Module:
        from training.eagle3.model import DraftConfig, Eagle3Draft
        from training.target.head import load_embeddings

        draft = Eagle3Draft(DraftConfig.from_dict(draft_config))
        missing, unexpected = draft.load_state_dict(weights, strict=False)
        if unexpected or set(missing) - {"embed_tokens.weight"}:
            raise ModelMismatchError(f"checkpoint {where} does not fit its config (missing {missing}, "
                                     f"unexpected {unexpected})")
        if target_dir and Path(target_dir).exists():
            draft.load_embeddings(load_embeddings(target_dir))
        return draft

    def export(self, request: ExportRequest) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        from training.eagle3.export_files import export_files

        return export_files(request.checkpoint, request.meta, request.weights, request.layer_inputs, request.fmt,
                            verifier=request.verifier, target_dir=request.target_dir)

    def recognises(self, config: dict[str, Any]) -> bool:
        return any(layout.recognises(config) for layout in LAYOUTS.values())

    def load_export(self, root: Path, config: dict[str, Any], target_dir: str | Path | None) -> nn.Module:
        from training.eagle3.load import load_exported

        return load_exported(root, config, target_dir)

    def verifier(self, config: dict[str, Any]) -> str | None:
        return layout_of(config).verifier(config)

    def proposer(self, draft: nn.Module, num_draft_tokens: int | None) -> Proposer:
        from training.eagle3.proposer import DraftProposer

        return DraftProposer(_eagle3(draft), num_draft_tokens)

    def offline_estimate(self, draft: nn.Module, store: str | Path, target_dir: str | Path, split: HeldOutSplit,
                         **options: Any) -> dict[str, Any]:
        from training.eagle3.offline import offline_estimate

        return offline_estimate(_eagle3(draft), store, target_dir, split, **options)
