"""A draft kind registered from this file alone trains, exports and evaluates through the core.

The toy kind is the smallest draft the core can run: one linear map from the target's aux states at
position t to the target's prediction at t+1 (the token after the next, as EAGLE-3's first step
predicts it), with no attention and no vocabulary of its own. Nothing of training/ or curator/ is
edited for it: `register` is all the core is told.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from curator.evaluation.measure import measure
from tests.training.train.test_trainer import make_store, tiny_config
from training.drafts.kind import BuildArgs, ExportRequest, HeldOutArgs, StartDraft
from training.drafts.registry import KINDS, kind_of_export, load_export, register
from training.errors import TrainingError
from training.eval.evaluate import load_target
from training.eval.prompts import EvalPrompt, HeldOutSplit, held_out_split
from training.feed.batches import States
from training.feed.packing import PackedBatch, pack_samples, step_valid
from training.io.export_folder import WEIGHTS_FILE
from training.storage.reader import HiddenStateStore
from training.target.head import TargetHead
from training.train.checkpoint import read_meta
from training.train.trainer import train
from training.export.export import export_checkpoint

ARCHITECTURE = "ToyAuxDraft"


class ToyDraft(nn.Module):
    """logits [N, V] = proj(aux [N, n_aux*Ht]): the target's prediction one position ahead."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config["aux_width"], config["vocab_size"], bias=False)

    def forward(self, aux: torch.Tensor) -> torch.Tensor:
        return self.proj(aux)


def toy_loss(draft: ToyDraft, batch: PackedBatch, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (summed loss, sums [1, 3]: loss, correct, positions) over the origins the core counts."""
    keep = step_valid(batch.valid()[0], batch.doc_ids[0], 0)  # [N-1]: origin t predicts the target at t+1
    logits = draft(batch.aux[0, :-1])[keep].float()  # (M, V)
    truth = labels[1:][keep]  # (M,)
    loss = F.cross_entropy(logits, truth, reduction="sum")
    correct = (logits.argmax(-1) == truth).sum()
    sums = torch.stack([loss.detach().double(), correct.double(), keep.sum().double()])[None]
    return loss, sums


class ToyObjective(nn.Module):
    def __init__(self, draft: ToyDraft) -> None:
        super().__init__()
        self.draft = draft

    def forward(self, batch: PackedBatch, labels: torch.Tensor, step_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss, sums = toy_loss(self.draft, batch, labels)
        return loss * step_scale[0], sums


class ToyProposer:
    """One drafted token from the last aux state, repeated to the chain's length (the verifier cuts it)."""

    def __init__(self, draft: ToyDraft) -> None:
        self.draft = draft.eval()
        self.aux_layer_ids: list[int] | None = list(draft.config["aux_layer_ids"])

    def begin(self, prompt_ids: list[int]) -> None:
        """The toy keeps no state between rounds."""

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, aux: torch.Tensor | None, steps: int, topk: int) -> list[list[int]]:
        assert aux is not None
        token = int(self.draft(aux[-1:].to(self.draft.proj.weight.dtype)).argmax(-1))
        return [[token] * steps]


class ToyKind:
    name = "toy"
    n_sums = 3
    checkpoint_weights: tuple[str, ...] = ("proj.weight",)
    formats: tuple[str, ...] = ("toy",)
    layouts: Mapping[str, Any] = {}

    def owns(self, draft: nn.Module) -> bool:
        return isinstance(draft, ToyDraft)

    def start_from(self, path: str, target_dir: str, target_config: dict[str, Any], vocab_size: int,
                   aux_layer_ids: list[int], train_args: Mapping[str, Any]) -> StartDraft:
        raise TrainingError("the toy kind starts from no export")

    def build(self, args: BuildArgs) -> nn.Module:
        width = len(args.aux_layer_ids) * int(args.target_config["hidden_size"])
        return ToyDraft({"aux_width": width, "vocab_size": args.head.vocab_size, "aux_layer_ids": list(args.aux_layer_ids)})

    def config_of(self, draft: nn.Module) -> dict[str, Any]:
        assert isinstance(draft, ToyDraft)
        return dict(draft.config)

    def prepare(self, device: torch.device) -> None:
        """The toy runs in eager torch: nothing to compile."""

    def objective(self, draft: nn.Module) -> nn.Module:
        assert isinstance(draft, ToyDraft)
        return ToyObjective(draft)

    def targets(self, batch: PackedBatch, head: TargetHead, draft: nn.Module) -> Any:
        with torch.no_grad():
            return head(batch.final[0]).argmax(-1)  # [N]: the target's prediction at each position

    def step(self, objective: nn.Module, batch: PackedBatch, targets: Any, step_scale: torch.Tensor,
             ttt_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        return objective(batch, targets, step_scale)

    def summarize(self, sums: torch.Tensor, step_weight: float) -> dict[str, Any]:
        positions = float(sums[0, 2].clamp(min=1))
        acc = float(sums[0, 1]) / positions
        return {"loss": float(sums[0, 0]) / positions, "acc": [acc], "accept_length": 1.0 + acc}

    def held_out(self, draft: nn.Module, store: States, ids: Sequence[str], head: TargetHead,
                 args: HeldOutArgs) -> dict[str, Any]:
        assert isinstance(draft, ToyDraft)
        batch = pack_samples(store, list(ids)[args.rank::args.world], args.max_length)
        batch = batch.to(next(draft.parameters()).device, torch.float32)
        with torch.no_grad():
            _, sums = toy_loss(draft, batch, self.targets(batch, head, draft))
        return self.summarize(args.reduce(sums), args.step_weight)

    def trainable_weights(self, draft: nn.Module) -> dict[str, torch.Tensor]:
        return dict(draft.state_dict())

    def from_checkpoint(self, draft_config: dict[str, Any], weights: dict[str, torch.Tensor],
                        target_dir: str | Path | None, where: Path) -> nn.Module:
        draft = ToyDraft(draft_config)
        draft.load_state_dict(weights)
        return draft

    def export(self, request: ExportRequest) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        config = {"architectures": [ARCHITECTURE], "toy": request.meta["draft_config"],
                  "curator": {"checkpoint": str(request.checkpoint.resolve()), "split": request.meta.get("split"),
                              "target_dir": request.meta["target_dir"]}}
        return {k: v.contiguous() for k, v in request.weights.items()}, config

    def recognises(self, config: dict[str, Any]) -> bool:
        return config.get("architectures") == [ARCHITECTURE]

    def load_export(self, root: Path, config: dict[str, Any], target_dir: str | Path | None) -> nn.Module:
        draft = ToyDraft(config["toy"])
        draft.load_state_dict(load_file(str(root / WEIGHTS_FILE)))
        return draft.eval()

    def verifier(self, config: dict[str, Any]) -> str | None:
        return None

    def proposer(self, draft: nn.Module, num_draft_tokens: int | None) -> ToyProposer:
        assert isinstance(draft, ToyDraft)
        return ToyProposer(draft)

    def offline_estimate(self, draft: nn.Module, store: str | Path, target_dir: str | Path, split: HeldOutSplit,
                         **options: Any) -> dict[str, Any]:
        states = HiddenStateStore.open(store)
        held, how = split.held_out(store, states.ids())
        head = TargetHead.from_pretrained(target_dir)
        args = HeldOutArgs(1, 1.0, rank=0, world=1, reduce=lambda t: t, batch_size=len(held), max_length=4096,
                           autocast=False)
        figures = self.held_out(draft, states, held, head, args)
        return {"samples": len(held), "split": how, "acceptance_length": figures["accept_length"],
                "teacher_forced": figures}


@pytest.fixture
def toy_kind() -> Iterator[ToyKind]:
    kind = ToyKind()
    register(kind)
    yield kind
    del KINDS[kind.name]  # the next test sees the built-in kinds only


@pytest.fixture(scope="module")
def toy_store(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tiny_target, tmp_path_factory.mktemp("toy_store"), n=24)


def test_a_kind_registered_from_a_test_trains_exports_and_evaluates(
        toy_kind: ToyKind, toy_store: Path, tiny_target: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = train(tiny_config(toy_store, tiny_target, run, draft_kind="toy", ttt_steps=1, lr=3e-2, max_steps=30,
                               eval_fraction=0.25))
    log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in log if r["split"] == "train"]
    assert trained[-1]["loss"] < trained[0]["loss"]  # the kind's objective is what the loop optimised
    assert log[-1]["split"] == "eval" and log[-1]["samples"] > 0 and 0.0 <= log[-1]["acc"][0] <= 1.0
    meta = read_meta(result.checkpoint)
    assert meta["draft_kind"] == "toy" and set(load_file(str(result.checkpoint / "draft.safetensors"))) == {"proj.weight"}

    export = export_checkpoint(run, tmp_path / "export", fmt="toy")
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and kind_of_export(config) is toy_kind

    drafter = load_export(export, tiny_target)
    assert isinstance(drafter, ToyDraft)
    target, tokenizer = load_target(tiny_target)
    prompts = [EvalPrompt(id=f"p{i}", messages=[{"role": "user", "content": text}], category="chat")
               for i, text in enumerate(["hello there", "what is a draft model", "tell me about tokens"])]
    # `curator eval`'s measurement, checked token for token against greedy decoding of the target
    report = measure(target, tokenizer, drafter, prompts, steps=2, max_new_tokens=8, tie_margin=1e-4,
                     offline=(toy_store, tiny_target, held_out_split(export)))
    assert len(report.prompts) == 3 and all(p.greedy_match == "exact" or p.greedy_match.startswith("tie@")
                                            for p in report.prompts)
    assert 1.0 <= report.overall.acceptance_length <= 3.0
    # the held-out split travelled with the export: the offline figure is the trainer's last eval, on the same ids
    assert report.offline["samples"] == log[-1]["samples"] and "held-out split" in report.offline["split"]
    assert report.offline["acceptance_length"] == pytest.approx(log[-1]["accept_length"])


def test_a_checkpoint_exports_only_in_its_own_kinds_formats(toy_kind: ToyKind, toy_store: Path, tiny_target: Path,
                                                            tmp_path: Path) -> None:
    train(tiny_config(toy_store, tiny_target, tmp_path / "run", draft_kind="toy", ttt_steps=1, max_steps=2))
    with pytest.raises(TrainingError, match="holds a toy draft, which exports as toy, not 'sglang'"):
        export_checkpoint(tmp_path / "run", tmp_path / "export", fmt="sglang")


def test_an_unknown_kind_is_refused_before_anything_is_opened(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="unknown draft kind 'dflash'; choose one of eagle3"):
        train(tiny_config(tmp_path / "no-store", tmp_path / "no-target", tmp_path / "run", draft_kind="dflash"))
    assert not (tmp_path / "run").exists()


def test_a_second_kind_of_the_same_name_is_refused(toy_kind: ToyKind) -> None:
    with pytest.raises(TrainingError, match="'toy' is registered already"):
        register(ToyKind())
