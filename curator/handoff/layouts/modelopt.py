"""NVIDIA ModelOpt (0.47.0): one torch file per conversation for its offline EAGLE-3 training.

    OUT/{i:08d}.pt     read by `OfflineSupervisedDataset` (torch.load(weights_only=True)) and batched by
                       `EagleOfflineDataCollator`:
        input_ids int64 [T]   loss_mask int64 [T]   conversation_id str (curator's row id)
        hidden_states bf16 [T, H]          the final state AFTER the target's final norm
        hidden_states_prenorm False        (ModelOpt's key for that convention)
        aux_hidden_states bf16 [T, n_aux*H]

ModelOpt hooks the OUTPUTS of its aux layers (`eagle_aux_hidden_state_layer_ids`, default
[1, N//2-1, N-4]): one below curator's ids. It uses the stored loss mask only with
`answer_only_loss=True`; without it every token, prompt included, is trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from curator.handoff.layouts.base import FileSink, Layout, LayoutWriter, Trap, torch_file
from curator.handoff.rows import HandoffRow, HandoffSource


def conversation_file(index: int) -> str:
    return f"{index:08d}.pt"


class ModelOptWriter(LayoutWriter):
    def add(self, index: int, row: HandoffRow) -> None:
        assert row.aux is not None and row.final is not None  # Layout.check refused a store without them
        tensors = {"input_ids": row.input_ids.long(), "loss_mask": row.loss_mask.long(), "conversation_id": row.id,
                   "hidden_states": row.final, "hidden_states_prenorm": False, "aux_hidden_states": row.aux}
        self.sink.submit(self.stage / conversation_file(index), torch_file(tensors))


ANSWER_ONLY_TRAP = Trap(
    "modelopt-answer-only-loss",
    "ModelOpt ignores the stored loss_mask unless training.answer_only_loss=true: without it the draft trains on "
    "every prompt token too (system prompts, tool results, the user's text)")
LAYER_TRAP = Trap(
    "modelopt-layer-ids",
    "ModelOpt hooks the outputs of eagle_aux_hidden_state_layer_ids (curator's ids minus 1): pass the manifest's "
    "aux_layer_ids in the eagle config")


@dataclass(frozen=True)
class ModelOptLayout(Layout):
    def writer(self, stage: Path, source: HandoffSource, sink: FileSink) -> LayoutWriter:
        return ModelOptWriter(stage, source, sink)

    def launch(self, out: Path, target: str, layer_ids: list[int] | None) -> str:
        layers = ",".join(map(str, layer_ids or []))
        return (f"python examples/speculative_decoding/main.py --config YOUR_RECIPE.yaml "
                f"model.model_name_or_path={target} data.offline_data_path={out} training.answer_only_loss=true "
                f"eagle.eagle_aux_hidden_state_layer_ids=[{layers}]")

    def traps(self) -> list[Trap]:
        return [ANSWER_ONLY_TRAP, LAYER_TRAP]


LAYOUT = ModelOptLayout(
    name="modelopt", trainer="NVIDIA/Model-Optimizer", verified="nvidia-modelopt 0.47.0", needs_states=True,
    final_norm="after", layer_offset=1,
    summary="{i}.pt: input_ids, loss_mask, conversation_id, hidden_states [T, H] (normed), aux_hidden_states [T, 3H]")
