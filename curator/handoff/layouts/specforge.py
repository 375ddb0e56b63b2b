"""SGLang's SpecForge (0.2.0): offline feature files, or pre-tokenised prompts for its online mode.

Offline (`data.hidden_states_path`; read by `OfflineManifestReader`, which walks the folder and sorts
the paths, and `normalize_offline_sample`):

    OUT/rows_{first:08d}-{last:08d}/data_{i:08d}.ckpt     one torch file per row, 1,000 per folder:
        input_ids int64 [T]   loss_mask int64 [T]
        hidden_state bf16 [1, T, H]        the final state AFTER the target's final norm
        aux_hidden_state bf16 [1, T, n_aux*H]

Online (`data.prompts_path`; `specforge.data.prompt_builder.prepare_prompt_tasks`): OUT/prompts.jsonl,
one {"id", "input_ids", "loss_mask"} a line; SpecForge's engine captures the states as it trains.

SpecForge numbers aux layers by their outputs, one below curator's (`model.aux_hidden_state_layer_ids`),
and reads feature files with `torch.load(weights_only=False)`: unpickling, which runs whatever code a
planted file holds. The rows' ids are in the manifest (file i is row i); the files hold tensors only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from curator.handoff.layouts.base import FileSink, Layout, LayoutWriter, Trap, torch_file
from curator.handoff.rows import HandoffRow, HandoffSource
from training.io.atomic import fsync_path

ROWS_PER_FOLDER = 1000
PROMPTS_FILE = "prompts.jsonl"


def feature_file(index: int) -> str:
    first = index - index % ROWS_PER_FOLDER
    return f"rows_{first:08d}-{first + ROWS_PER_FOLDER - 1:08d}/data_{index:08d}.ckpt"


class OfflineWriter(LayoutWriter):
    def add(self, index: int, row: HandoffRow) -> None:
        assert row.aux is not None and row.final is not None  # Layout.check refused a store without them
        tensors = {"input_ids": row.input_ids.long(), "loss_mask": row.loss_mask.long(),
                   "hidden_state": row.final.unsqueeze(0), "aux_hidden_state": row.aux.unsqueeze(0)}
        self.sink.submit(self.stage / feature_file(index), torch_file(tensors))


class PromptsWriter(LayoutWriter):
    def __init__(self, stage: Path, source: HandoffSource, sink: FileSink) -> None:
        super().__init__(stage, source, sink)
        self._path = stage / PROMPTS_FILE
        self._file: IO[str] = open(self._path, "w", encoding="utf-8")

    def add(self, index: int, row: HandoffRow) -> None:
        line = {"id": row.id, "input_ids": row.input_ids.tolist(), "loss_mask": row.loss_mask.long().tolist()}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> dict[str, Any]:
        self._file.flush()
        fsync_path(self._path)
        self._file.close()
        return {}


PICKLE_TRAP = Trap(
    "specforge-pickle",
    "SpecForge loads every .ckpt under the folder with torch.load(weights_only=False): a planted file runs code "
    "when read. Train only on an export you made; `curator export-data --check OUT` loads each file with "
    "weights_only=True and refuses any file the manifest does not name")
LAYER_TRAP = Trap(
    "specforge-layer-ids",
    "SpecForge numbers aux layers by their outputs (curator's ids minus 1): set the manifest's aux_layer_ids as "
    "model.aux_hidden_state_layer_ids in the run's YAML (SpecForge 0.2.0 refuses that override on the command line); "
    "its default [1, N//2-1, N-4] equals curator's default [2, N//2, N-3]")


def _layers_note(layer_ids: list[int] | None) -> str:
    # SpecForge 0.2.0 parses an override as YAML only where the field already holds a list, and this one
    # defaults to null: `model.aux_hidden_state_layer_ids=[..]` stays a string and is refused. The run file says it.
    return f"  # YOUR_RUN.yaml sets model: aux_hidden_state_layer_ids: {layer_ids}" if layer_ids else ""


@dataclass(frozen=True)
class SpecForgeOffline(Layout):
    def writer(self, stage: Path, source: HandoffSource, sink: FileSink) -> LayoutWriter:
        return OfflineWriter(stage, source, sink)

    def launch(self, out: Path, target: str, layer_ids: list[int] | None) -> str:
        return (f"specforge train --config YOUR_RUN.yaml model.target_model_path={target} "
                f"data.hidden_states_path={out}{_layers_note(layer_ids)}")

    def traps(self) -> list[Trap]:
        return [PICKLE_TRAP, LAYER_TRAP]


@dataclass(frozen=True)
class SpecForgeOnline(Layout):
    def writer(self, stage: Path, source: HandoffSource, sink: FileSink) -> LayoutWriter:
        return PromptsWriter(stage, source, sink)

    def check(self, source: HandoffSource) -> None:
        return None  # token ids only: any store's rows, any layers

    def launch(self, out: Path, target: str, layer_ids: list[int] | None) -> str:
        return (f"specforge train --config YOUR_RUN.yaml model.target_model_path={target} "
                f"data.prompts_path={out / PROMPTS_FILE}{_layers_note(layer_ids)}")

    def traps(self) -> list[Trap]:
        return [LAYER_TRAP]


OFFLINE = SpecForgeOffline(
    name="specforge-offline", trainer="sgl-project/SpecForge", verified="specforge 0.2.0", needs_states=True,
    final_norm="after", layer_offset=1,
    summary="rows_*/data_*.ckpt: input_ids, loss_mask, hidden_state [1, T, H] (normed), aux_hidden_state [1, T, 3H]")
ONLINE = SpecForgeOnline(
    name="specforge-online", trainer="sgl-project/SpecForge", verified="specforge 0.2.0", needs_states=False,
    final_norm=None, layer_offset=1, summary="prompts.jsonl: {id, input_ids, loss_mask} (data.prompts_path)")
